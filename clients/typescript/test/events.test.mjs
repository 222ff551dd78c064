// The live event stream as an async iterator: the event of a write arrives, a stream resumes
// after the id given, a cut connection is resumed after the last id seen (nothing lost, nothing
// twice), and an id the server never had is refused by name.

import assert from "node:assert/strict";
import { after, test } from "node:test";

import { AuthenticationError, Client, ServerError } from "gieok";
import { ADMIN_KEY, channelName, FAST, KEY, OTHER_KEY, startProxy, URL } from "./helpers.mjs";

const memory = new Client({ baseUrl: URL, apiKey: KEY, ...FAST });
const proxies = [];
after(() => Promise.all(proxies.map((proxy) => proxy.close())));

/** A stream that gives up after 10 s (a test that waits for an event that never comes fails, it does not hang). */
const soon = () => AbortSignal.timeout(10_000);

const carries = (event, text) => event.type === "memory.added" && event.data.blocks?.some((block) => block.text === text);

/** The `memory.added` event that carries `text`, read from `events` (an iterator it leaves open). */
async function next(events, text) {
  for (;;) {
    const { value, done } = await events.next();
    assert.ok(!done, `no memory.added event with ${JSON.stringify(text)}`);
    if (carries(value, text)) return value;
  }
}

/** The `memory.added` event that carries `text`, from a stream of `client`'s opened for it (and closed). */
async function added(client, options, text) {
  for await (const event of client.events({ ...options, signal: soon() })) {
    if (carries(event, text)) return event;
  }
  assert.fail(`the stream ended without ${JSON.stringify(text)}`);
}

/** A text no earlier run wrote (the server's buffer holds those too). */
const fresh = (text) => `${text} (${channelName("run")})`;

test("the event of a write arrives, from the buffer and then live", async () => {
  const channel = channelName("events");
  const first = fresh("민지: 오늘 보리 병원 다녀왔어");
  await memory.addMessages(channel, [{ id: "e1", role: "user", text: first, user: "u-minji", name: "민지" }]);
  const events = memory.events({ since: 0, kinds: ["memory.*"], signal: soon() });
  try {
    const replayed = await next(events, first);
    assert.equal(replayed.type, "memory.added");
    assert.ok(replayed.seq > 0 && replayed.time > 0);
    assert.equal(replayed.data.blocks[0].scope.channel, channel);

    const second = fresh("Alex: the vet said Bori is fine");
    const write = memory.addMessages(channel, [{ id: "e2", role: "user", text: second, user: "u-alex", name: "Alex" }]);
    const live = await next(events, second);
    await write;
    assert.ok(live.seq > replayed.seq);
  } finally {
    await events.return();
  }
});

test("a stream resumes after the id it is given, and another tenant's stream never sees these events", async () => {
  const channel = channelName("resume");
  const before = fresh("지우: 부산 가는 기차 예매했어");
  const later = fresh("지우: 해운대 숙소도 잡았어");
  await memory.addMessages(channel, [{ id: "r1", role: "user", text: before, user: "u-jiwoo" }]);
  const seen = await added(memory, { since: 0, kinds: ["memory.added"] }, before);
  await memory.addMessages(channel, [{ id: "r2", role: "user", text: later, user: "u-jiwoo" }]);

  const resumed = memory.events({ since: seen.seq, kinds: ["memory.added"], signal: soon() });
  const first = (await resumed.next()).value; // nothing at or before the id given
  await resumed.return();
  assert.ok(first.seq > seen.seq);
  assert.ok(carries(first, later) || (await added(memory, { since: seen.seq }, later)).seq > seen.seq);

  const other = new Client({ baseUrl: URL, apiKey: OTHER_KEY, ...FAST });
  const mine = `acme: ${channelName("own")}`;
  await other.addMessages(channelName("acme"), [{ id: "a1", role: "user", text: mine, user: "u-acme" }]);
  const collected = [];
  for await (const event of other.events({ since: 0, signal: soon() })) {
    collected.push(JSON.stringify(event.data));
    if (event.type === "memory.added" && event.data.blocks?.some((block) => block.text === mine)) break;
  }
  assert.ok(collected.some((data) => data.includes(mine)));
  assert.ok(!collected.some((data) => data.includes(before) || data.includes(later)));
});

test("a cut stream is resumed after the last id seen: nothing lost, nothing twice", async () => {
  const channel = channelName("cut");
  const texts = ["Alex: packing for Berlin", "Alex: the flight is at 7", "민지: 잘 다녀와!"].map(fresh);
  await memory.addMessages(channel, [{ id: "c1", role: "user", text: texts[0], user: "u-alex" }]);
  const start = await added(memory, { since: 0, kinds: ["memory.added"] }, texts[0]);
  await memory.addMessages(channel, [{ id: "c2", role: "user", text: texts[1], user: "u-alex" },
                                     { id: "c3", role: "user", text: texts[2], user: "u-minji" }]);

  const cutting = await startProxy(URL, ["cut-after-first-event"]);
  proxies.push(cutting);
  const events = new Client({ baseUrl: cutting.url, apiKey: KEY, ...FAST }).events({ since: start.seq - 1, signal: soon() });
  const seqs = [];
  for await (const event of events) {
    seqs.push(event.seq);
    if (event.type === "memory.added" && event.data.blocks?.some((block) => block.text === texts[2])) break;
  }
  assert.equal(seqs[0], start.seq); // the first connection's only event …
  assert.match(cutting.requests[1], new RegExp(`^GET /v1/events\\?since=${start.seq} `)); // … resumed after it
  assert.deepEqual(seqs, [...new Set(seqs)].sort((a, b) => a - b)); // in order, none twice
  assert.ok(seqs.length >= 2);
});

test("an id the stream never had is refused by name, with the latest id", async () => {
  await assert.rejects(memory.events({ since: 2 ** 52 }).next(), (error) => {
    assert.ok(error instanceof ServerError);
    assert.equal(error.status, 409);
    assert.equal(error.type, "since_ahead");
    assert.equal(typeof error.envelope.latest, "number");
    return true;
  });
});

test("a key revoked while its stream is open ends the loop with AuthenticationError", async () => {
  const admin = { Authorization: `Bearer ${ADMIN_KEY}`, "Content-Type": "application/json" };
  const made = await (await fetch(`${URL}/v1/keys`, { method: "POST", headers: admin,
                                                       body: JSON.stringify({ role: "read", name: "a stream to revoke" }) })).json();
  const events = new Client({ baseUrl: URL, apiKey: made.key, ...FAST }).events({ kinds: ["memory.added"], signal: soon() });
  const first = events.next(); // the stream opens …
  const channel = channelName("revoke");
  for (let n = 0; !(await Promise.race([first.then(() => true), new Promise((ok) => setTimeout(ok, 200, false))])); n += 1) {
    assert.ok(n < 25, "the stream never delivered a write's event");
    await memory.addMessages(channel, [{ id: `v${n}`, role: "user", text: `ping ${n}`, user: "u-minji" }]); // … until it is live
  }
  const revoked = await fetch(`${URL}/v1/keys/${made.id}`, { method: "DELETE", headers: admin });
  assert.equal(revoked.status, 200);
  await assert.rejects(async () => { for (;;) await events.next(); }, (error) => {
    assert.ok(error instanceof AuthenticationError, String(error));
    assert.equal(error.type, "revoked"); // said by the stream itself, not by a refused reconnect
    return true;
  });
});

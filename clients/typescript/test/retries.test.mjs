// Retries as they run on real sockets: a write whose answer is lost is sent again with the same
// Idempotency-Key (and the same message ids) and stored once; refused connections, 503s and
// timeouts are retried with backoff, then become the typed error that names the server.

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, test } from "node:test";

import { Client, ServerUnavailableError, StorageFullError, StoreError } from "gieok";
import { channelName, closedUrl, FAST, KEY, startProxy, URL } from "./helpers.mjs";

const memory = new Client({ baseUrl: URL, apiKey: KEY, ...FAST });
const proxies = [];
after(() => Promise.all(proxies.map((proxy) => proxy.close())));

async function proxy(script) {
  const started = await startProxy(URL, script);
  proxies.push(started);
  return started;
}

function answer503(type = "unavailable") {
  const body = JSON.stringify({ error: { type, message: "away for a moment" } });
  return `HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 0\r\n`
    + `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

test("a write whose answer was lost is sent again with the same Idempotency-Key and stored once", async () => {
  const lossy = await proxy(["drop-answer"]);
  const channel = channelName("lost");
  const block = await new Client({ baseUrl: lossy.url, apiKey: KEY, ...FAST })
    .add("지우: 다음 주에 부산 가", { scope: { channel } });

  const [first, second] = lossy.idempotencyKeys();
  assert.ok(first, "the first attempt carried an Idempotency-Key");
  assert.equal(second, first);
  assert.match(lossy.answers[0], /^HTTP\/1\.1 201/); // the server stored it the first time …
  assert.match(lossy.answers[1], /\r\nidempotent-replayed: true\r\n/i); // … and replayed that answer
  const stored = await memory.listBlocks({ scope: { channel } });
  assert.deepEqual(stored.items.map((b) => b.block_index), [block.block_index]); // one block, not two
});

test("messages whose answer was lost are resent with the same ids and key, and kept once", async () => {
  const lossy = await proxy(["drop-answer"]);
  const channel = channelName("lost-messages");
  const result = await new Client({ baseUrl: lossy.url, apiKey: KEY, ...FAST }).addMessages(channel, [
    { id: "r1", role: "user", text: "I adopted a cat named Nabi", user: "u-alex", name: "Alex" },
    { id: "r2", role: "user", text: "나비는 세 살이야", user: "u-alex", name: "Alex" },
  ]);
  assert.deepEqual(result.stored.map((m) => m.id), ["r1", "r2"]);
  const keys = lossy.idempotencyKeys();
  assert.equal(keys.length, 2);
  assert.equal(keys[0], keys[1]);
  assert.ok(lossy.requests.every((head) => head.includes('"id":"r1"') && head.includes('"id":"r2"')));
  const recent = (await memory.context(channel, { include: ["recent"] })).parts.recent;
  assert.deepEqual(recent.map((m) => m.text), ["I adopted a cat named Nabi", "나비는 세 살이야"]);
});

test("a 503 is retried after its Retry-After; a 503 that lasts becomes the typed error", async () => {
  const flaky = await proxy([answer503()]);
  const stats = await new Client({ baseUrl: flaky.url, apiKey: KEY, ...FAST }).stats();
  assert.ok(stats.blocks > 0);
  assert.equal(flaky.requests.length, 2);

  const down = await proxy([answer503(), answer503(), answer503()]);
  await assert.rejects(new Client({ baseUrl: down.url, apiKey: KEY, retries: 2, backoffMs: 1 }).stats(), (error) => {
    assert.ok(error instanceof ServerUnavailableError);
    assert.equal(error.status, 503);
    assert.match(error.message, /unavailable \(503 after 3 attempts\): away for a moment/);
    return true;
  });
  const store = await proxy([answer503("store_unavailable")]);
  await assert.rejects(new Client({ baseUrl: store.url, apiKey: KEY, retries: 0 }).stats(), StoreError);
});

test("a 507 (the server's disk is full) is StorageFullError at once, not retried", async () => {
  const body = JSON.stringify({ error: { type: "storage_full", message: "cannot write home.db: the disk is full" } });
  const full = await proxy([`HTTP/1.1 507 Insufficient Storage\r\nContent-Type: application/json\r\n`
    + `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`]);
  await assert.rejects(new Client({ baseUrl: full.url, apiKey: KEY, ...FAST }).add("민지: 디스크가 꽉 찼어", {
    scope: { channel: channelName("full") } }), (error) => {
    assert.ok(error instanceof StorageFullError && error instanceof StoreError);
    assert.equal(error.status, 507);
    assert.equal(error.type, "storage_full");
    assert.match(error.message, /disk is full/);
    return true;
  });
  assert.equal(full.requests.length, 1);
});

test("a refused connection is retried with backoff, then ServerUnavailableError names the server", async () => {
  const closed = await closedUrl();
  const started = Date.now();
  await assert.rejects(new Client({ baseUrl: closed, apiKey: KEY, retries: 2, backoffMs: 20 }).stats(), (error) => {
    assert.ok(error instanceof ServerUnavailableError);
    assert.equal(error.status, undefined);
    assert.ok(error.message.startsWith(`cannot reach the gieok server at ${closed} (GET /v1/stats): `), error.message);
    assert.match(error.message, /ECONNREFUSED.*\(tried 3 times\)$/);
    return true;
  });
  assert.ok(Date.now() - started >= 20 * 0.5 + 40 * 0.5, "it waited between attempts");

  const refusing = await proxy(["refuse"]); // a connection reset once, then the server
  assert.ok((await new Client({ baseUrl: refusing.url, apiKey: KEY, ...FAST }).stats()).blocks > 0);
});

test("an answer that does not come within timeoutMs is retried, then a timeout error", async () => {
  const silent = createServer((socket) => socket.on("error", () => undefined)); // accepts, never answers
  await new Promise((resolve) => silent.listen(0, "127.0.0.1", resolve));
  try {
    const url = `http://127.0.0.1:${silent.address().port}`;
    await assert.rejects(new Client({ baseUrl: url, apiKey: KEY, timeoutMs: 150, retries: 1, backoffMs: 1 }).stats(),
                         (error) => error instanceof ServerUnavailableError && /within 150 ms.*tried 2 times/.test(error.message));
  } finally {
    silent.close();
  }
});

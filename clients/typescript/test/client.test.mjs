// The client's calls against a real `gieok serve`: the agent's two calls (messages, context) in
// Korean and English, search, blocks, facts, users, typed errors, and two tenants that cannot
// reach each other's data.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  AuthenticationError, BlockNotFoundError, Client, GieokError, InvalidInputError, InvalidTypeError, NotFoundError,
  PermissionDeniedError, VERSION,
} from "gieok";
import { ADMIN_KEY, channelName, closedUrl, FAST, KEY, OTHER_KEY, READ_KEY, URL } from "./helpers.mjs";

const memory = new Client({ baseUrl: URL, apiKey: KEY, ...FAST });

test("the package's version is the Python package's, and the client reads its server and key from the environment", () => {
  const manifest = JSON.parse(readFileSync(new globalThis.URL("../package.json", import.meta.url), "utf8"));
  assert.equal(VERSION, manifest.version);
  assert.equal(manifest.version, "0.1.0");
  assert.equal(new Client().baseUrl, URL); // GIEOK_URL
});

test("messages added with index behind are answered before their turns are written, and found a moment later", async () => {
  const channel = channelName();
  const text = "다음 달에 제주도로 이사 가. 새 집은 바다 바로 앞이야";
  const result = await memory.addMessages(channel, [{ id: "b1", role: "user", text, user: "u-minji", name: "민지" }],
                                          { guild: "g1", index: "behind" });
  assert.equal(result.index, "behind");
  assert.deepEqual(result.stored.map((m) => m.id), ["b1"]);
  assert.equal(result.stored[0].block_index, null); // written just after the answer
  const context = await memory.context(channel, { guild: "g1", user: "u-minji", query: "어디로 이사 가?" });
  assert.deepEqual(context.parts.recent.map((m) => m.text), [text]); // in the next context at once
  let found = [];
  for (let tries = 0; tries < 100 && !found.length; tries += 1) {
    found = (await memory.search("제주도 이사", { k: 5, scope: { guild: "g1", channel } })).hits;
    if (!found.length) await new Promise((done) => setTimeout(done, 100));
  }
  assert.ok(found.some((hit) => hit.block.text === text), "its turn block is searchable once written");
  await assert.rejects(memory.addMessages(channel, [{ id: "b2", role: "user", text: "x", user: "u" }],
                                          { index: "later" }), InvalidInputError);
});

test("messages in Korean and English come back in the conversation's context", async () => {
  const channel = channelName();
  const messages = [
    { id: "m1", role: "user", text: "우리 고양이 보리는 츄르를 제일 좋아해", user: "u-minji", name: "민지" },
    { id: "m2", role: "user", text: "My dog Max only eats salmon treats", user: "u-alex", name: "Alex" },
    { id: "m3", role: "assistant", text: "보리랑 Max 둘 다 입맛이 확실하네요!", name: "bot" },
  ];
  const result = await memory.addMessages(channel, messages, { guild: "g1" });
  assert.deepEqual(result.stored.map((m) => m.id), ["m1", "m2", "m3"]);
  assert.deepEqual(result.conversation, { guild: "g1", channel, user: null });
  assert.ok(result.stored.every((m) => m.l1_id !== null));
  assert.ok(result.timings_ms.total_ms > 0, JSON.stringify(result.timings_ms)); // the server's time per stage

  const again = await memory.addMessages(channel, messages.slice(0, 1), { guild: "g1" });
  assert.deepEqual(again.duplicates, ["m1"]); // an id is stored once
  assert.deepEqual(again.stored, []);

  const korean = await memory.context(channel, { guild: "g1", user: "u-minji", query: "보리가 좋아하는 간식", budgetTokens: 1000 });
  assert.equal(korean.known, true);
  assert.equal(korean.language, "ko");
  assert.match(korean.text, /보리는 츄르를 제일 좋아해/);
  assert.deepEqual(korean.parts.recent.map((m) => m.text), messages.map((m) => m.text));
  assert.equal(korean.budget_tokens, 1000);
  assert.ok(korean.tokens.total > 0 && korean.tokens.total <= 1000);

  const english = await memory.context(channel, { guild: "g1", user: "u-alex", query: "what does Max eat?",
                                                  include: ["recent"] });
  assert.equal(english.language, "en");
  assert.match(english.text, /salmon treats/);
  assert.deepEqual(english.parts.facts, []);

  const unknown = await memory.context(channelName("nowhere"), { query: "anything" });
  assert.equal(unknown.known, false);
  assert.equal(unknown.conversation, null);
  assert.match(unknown.warnings.join(" "), /no conversation/);
});

test("search finds turns in Korean and English, with each hit's score breakdown", async () => {
  const channel = channelName("search");
  await memory.addMessages(channel, [
    { id: "s1", role: "user", text: "다음 주에 부산으로 여행 가", user: "u-jiwoo", name: "지우" },
    { id: "s2", role: "user", text: "I got the offer from Nuvola Labs", user: "u-alex", name: "Alex" },
  ]);
  const korean = await memory.search("부산 여행", { k: 3, scope: { channel } });
  assert.equal(korean.query, "부산 여행");
  assert.match(korean.hits[0].block.text, /부산으로 여행/);
  assert.equal(korean.hits[0].block.scope.channel, channel);
  assert.ok(korean.hits[0].breakdown.final > 0);
  const english = await memory.search("which company made Alex an offer", { k: 3, scope: { channel }, mode: "hybrid" });
  assert.match(english.hits[0].block.text, /Nuvola Labs/);
  assert.ok(english.search_time_ms >= 0);
});

test("blocks: add, get, list and forget", async () => {
  const channel = channelName("blocks");
  const block = await memory.add("민지: 고양이 입양했어! 이름은 보리야", { scope: { guild: "g1", channel }, speaker: "민지",
                                                                 importance: 0.8, tags: ["pet"] });
  assert.equal(block.kind, "turn");
  assert.equal(block.importance, 0.8);
  assert.deepEqual(block.tags, ["pet"]);
  const [second] = await memory.addMany([{ text: "Alex: I moved to Berlin", scope: { channel }, eventTime: new Date() }]);
  assert.equal((await memory.get(block.block_index)).text, block.text);
  const page = await memory.listBlocks({ scope: { channel }, limit: 10 });
  assert.deepEqual(page.items.map((b) => b.block_index), [second.block_index, block.block_index]); // newest first
  assert.equal(page.next_cursor, null);
  assert.deepEqual(await memory.forget(block.block_index), [block.block_index]);
  assert.equal((await memory.get(block.block_index)).forgotten, true);
  await assert.rejects(memory.get(10_000_000), BlockNotFoundError);
});

test("facts: state, list, correct, trace and forget", async () => {
  const user = `u-${channelName("fact")}`;
  const stated = await memory.addFact(`<user:${user}>는 부산에 산다.`, { user });
  assert.equal(stated.action, "stored");
  assert.equal(stated.fact.user_id, user);
  const listed = await memory.facts({ user });
  assert.deepEqual(listed.map((f) => f.text), [`<user:${user}>는 부산에 산다.`]);
  assert.equal(listed[0].current, true);

  const corrected = await memory.correctFact(stated.fact.block_index, `<user:${user}>는 서울에 산다.`);
  assert.ok(corrected.fact.block_index !== stated.fact.block_index);
  const history = await memory.factHistory(corrected.fact.block_index);
  assert.ok(history.length >= 2, JSON.stringify(history));
  assert.deepEqual((await memory.facts({ user })).map((f) => f.text), [`<user:${user}>는 서울에 산다.`]);

  const erased = await memory.forgetFact(corrected.fact.block_index);
  assert.ok(erased.includes(corrected.fact.block_index));
  // the correction erased, the fact's history forms again without it
  assert.deepEqual((await memory.facts({ user })).map((f) => f.text), [`<user:${user}>는 부산에 산다.`]);
});

test("users: listed, an access request is an admin's, erasure removes them", async () => {
  const channel = channelName("users");
  const user = `u-${channelName("person")}`;
  await memory.addMessages(channel, [{ id: "p1", role: "user", text: "I live in Lisbon now", user, name: "Rui" }]);
  const page = await memory.users({ limit: 200 });
  const found = page.users.find((u) => u.user === user);
  assert.ok(found, `${user} not in ${JSON.stringify(page.users.map((u) => u.user))}`);
  assert.deepEqual(found.names, ["Rui"]);
  await assert.rejects(memory.userData(user), PermissionDeniedError); // a write key is not an admin's
  const held = JSON.stringify(await new Client({ baseUrl: URL, apiKey: ADMIN_KEY }).userData(user));
  assert.ok(held.includes("I live in Lisbon now"), held.slice(0, 500));
  const receipt = await memory.forgetUser(user);
  assert.equal(typeof receipt, "object");
  assert.ok(!(await memory.users({ limit: 200 })).users.some((u) => u.user === user));
});

test("a conversation's summary, and deleting one message", async () => {
  const channel = channelName("delete");
  await memory.addMessages(channel, [
    { id: "d1", role: "user", text: "내 전화번호는 비밀이야", user: "u-minji" },
    { id: "d2", role: "user", text: "오늘 날씨 좋다", user: "u-minji" },
  ], { guild: "g2" });
  const summary = await memory.summary(channel, { guild: "g2" });
  assert.equal(typeof summary.markdown, "string");
  const receipt = await memory.deleteMessage(channel, "d1", { guild: "g2" });
  assert.equal(typeof receipt, "object");
  const context = await memory.context(channel, { guild: "g2", include: ["recent"] });
  assert.deepEqual(context.parts.recent.map((m) => m.text), ["오늘 날씨 좋다"]);
  await assert.rejects(memory.deleteMessage(channel, "never-sent", { guild: "g2" }), NotFoundError);
});

test("stats, verify and readiness", async () => {
  assert.ok((await memory.stats()).live_blocks > 0);
  assert.equal((await memory.verify()).ok, true);
  assert.equal(await memory.ready(), true);
  await memory.waitReady({ timeoutMs: 2000 });
  const nowhere = new Client({ baseUrl: await closedUrl(), apiKey: KEY, retries: 0 });
  assert.equal(await nowhere.ready(), false); // unreachable: not ready, and no error
});

test("refusals are typed errors with the server's message", async () => {
  await assert.rejects(new Client({ baseUrl: URL, apiKey: "gk_wrong_key" }).stats(), (error) => {
    assert.ok(error instanceof AuthenticationError && error instanceof GieokError);
    assert.equal(error.name, "AuthenticationError");
    assert.equal(error.status, 401);
    assert.equal(error.type, "unauthenticated");
    return true;
  });
  await assert.rejects(new Client({ baseUrl: URL, apiKey: "" }).stats(), /no API key .* GIEOK_API_KEY/);
  await assert.rejects(new Client({ baseUrl: URL, apiKey: READ_KEY }).add("읽기 키로 쓰기"), (error) => {
    assert.ok(error instanceof PermissionDeniedError);
    assert.equal(error.status, 403);
    return true;
  });
  await assert.rejects(memory.context("cafe", { budgetTokens: 5 }), (error) => {
    assert.ok(error instanceof InvalidInputError);
    assert.equal(error.status, 422);
    assert.equal(error.message, "body.budget_tokens: Input should be greater than or equal to 100");
    return true;
  });
  await assert.rejects( // epoch milliseconds (Date.now()) are refused by name
    memory.addMessages(channelName(), [{ id: "t1", role: "user", text: "hi", user: "u-a", time: Date.now() }]),
    (error) => error instanceof InvalidInputError && error.status === 400 && /milliseconds/.test(error.message));
});

test("what cannot be sent is refused before anything is sent", async () => {
  const offline = new Client({ baseUrl: await closedUrl(), apiKey: KEY, retries: 0 }); // a request would fail otherwise
  await assert.rejects(offline.addMessages("cafe", [{ id: "a", role: "user", text: "x", user: "u" }, { role: "user", text: "y" }]),
                       (error) => error instanceof InvalidInputError && /message 1 has no id/.test(error.message));
  await assert.rejects(offline.addMessages("cafe", []), InvalidInputError);
  await assert.rejects(offline.search("x", { scope: { room: "1" } }), /unknown scope key\(s\) 'room'/);
  await assert.rejects(offline.get("1"), InvalidTypeError);
  await assert.rejects(offline.add("x", { importance: Number.NaN }), /cannot be sent as JSON/);
  assert.throws(() => new Client({ baseUrl: "127.0.0.1:8420" }), InvalidInputError);
});

test("one tenant's key cannot reach another tenant's messages, facts or users", async () => {
  const channel = channelName("private");
  const secret = `민지의 비밀 코드는 ${channelName("code")}`;
  const owner = `u-${channelName("owner")}`;
  const written = await memory.addMessages(channel, [{ id: "x1", role: "user", text: secret, user: owner, name: "민지" }]);
  const fact = await memory.addFact(`<user:${owner}>는 제주에 산다.`, { user: owner });

  const other = new Client({ baseUrl: URL, apiKey: OTHER_KEY, ...FAST });
  const context = await other.context(channel, { user: owner, query: secret });
  assert.equal(context.known, false);
  assert.ok(!context.text.includes(secret));
  assert.ok(!(await other.search(secret, { k: 10 })).hits.some((hit) => hit.block.text === secret));
  assert.deepEqual(await other.facts({ user: owner }), []);
  assert.ok(!(await other.users({ limit: 200 })).users.some((u) => u.user === owner));
  await assert.rejects(other.deleteMessage(channel, "x1"), NotFoundError);
  await assert.rejects(other.forgetFact(fact.fact.block_index), NotFoundError);
  try { // an index of the other memory is not found there, or is that memory's own block
    assert.notEqual((await other.get(written.stored[0].block_index)).text, secret);
  } catch (error) {
    assert.ok(error instanceof BlockNotFoundError);
  }
  // and the owner still has everything
  assert.match((await memory.context(channel, { user: owner, query: secret })).text, /비밀 코드/);
  assert.equal((await memory.facts({ user: owner })).length, 1);
});

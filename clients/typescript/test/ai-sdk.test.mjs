// The Vercel AI SDK middleware with the real `ai` package and its OpenAI-compatible provider,
// pointed at a loopback model, against the real `gieok serve`: gieok's context reaches the model's
// system prompt (as the model received it), and each exchange is stored (read back with the client).

import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText, wrapLanguageModel } from "ai";
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, InvalidInputError, ServerUnavailableError } from "gieok";
import { gieokMiddleware } from "gieok/ai-sdk";
import { channelName, closedUrl, FAST, KEY, startModel, URL } from "./helpers.mjs";

const memory = new Client({ baseUrl: URL, apiKey: KEY, ...FAST });
let model;
let base;

before(async () => {
  model = await startModel((body) => (JSON.stringify(body.messages).includes("Berlin")
    ? "You told me you moved to Berlin." : "보리는 츄르를 제일 좋아한다고 했어요."));
  base = createOpenAICompatible({ name: "loopback", baseURL: model.url, apiKey: "not-needed" })("test-model");
});
after(() => model.close());

const recent = async (channel, guild) =>
  (await memory.context(channel, { guild, include: ["recent"] })).parts.recent.map((m) => [m.role, m.text]);

test("generateText: the context reaches the system prompt, and the exchange is stored", async () => {
  const channel = channelName("ai");
  await memory.addMessages(channel, [
    { id: "h1", role: "user", text: "우리 고양이 보리는 츄르를 제일 좋아해", user: "u-minji", name: "민지" },
  ], { guild: "g1" });
  const wrapped = wrapLanguageModel({
    model: base,
    middleware: gieokMiddleware({ client: memory, channel, guild: "g1", user: "u-minji", name: "민지" }),
  });
  const sent = model.received.length;
  const result = await generateText({ model: wrapped, instructions: "You are a friendly assistant.",
                                      prompt: "보리가 좋아하는 간식이 뭐였지?" });
  assert.equal(result.text, "보리는 츄르를 제일 좋아한다고 했어요.");

  const system = model.system(sent);
  assert.ok(system.startsWith("You are a friendly assistant.\n\n"), system); // the app's own instructions first
  assert.match(system, /보리는 츄르를 제일 좋아해/); // then gieok's memory of the conversation
  assert.equal(model.received[sent].messages.at(-1).content, "보리가 좋아하는 간식이 뭐였지?");

  assert.deepEqual(await recent(channel, "g1"), [
    ["user", "우리 고양이 보리는 츄르를 제일 좋아해"],
    ["user", "보리가 좋아하는 간식이 뭐였지?"],
    ["assistant", "보리는 츄르를 제일 좋아한다고 했어요."],
  ]);
});

test("streamText: the streamed answer is stored once the stream ends; a call names its own conversation", async () => {
  const channel = channelName("ai-stream");
  await memory.addMessages(channel, [{ id: "h1", role: "user", text: "I just moved to Berlin", user: "u-alex", name: "Alex" }]);
  const wrapped = wrapLanguageModel({ model: base, middleware: gieokMiddleware({ client: memory, user: "u-alex" }) });
  const sent = model.received.length;
  const call = () => streamText({
    model: wrapped, prompt: [{ role: "user", content: "Where do I live now?" }],
    providerOptions: { gieok: { channel, name: "Alex", messageId: "app-msg-7" } },
  });
  const result = call();
  let streamed = "";
  for await (const piece of result.textStream) streamed += piece;
  assert.equal(streamed, "You told me you moved to Berlin.");
  assert.equal(model.received[sent].stream, true);
  assert.match(model.system(sent), /I just moved to Berlin/); // no system prompt of the app's: gieok's alone

  const stored = await recent(channel);
  assert.deepEqual(stored, [
    ["user", "I just moved to Berlin"],
    ["user", "Where do I live now?"],
    ["assistant", "You told me you moved to Berlin."],
  ]);
  await call().text; // the same message id again (a resent request): stored once
  assert.deepEqual(await recent(channel), stored);
});

test("a call without a conversation is refused before the model is called", async () => {
  const wrapped = wrapLanguageModel({ model: base, middleware: gieokMiddleware({ client: memory, user: "u-minji" }) });
  const sent = model.received.length;
  await assert.rejects(generateText({ model: wrapped, prompt: "안녕", maxRetries: 0 }),
                       (error) => error instanceof InvalidInputError && /needs a channel/.test(error.message));
  assert.equal(model.received.length, sent);
});

test("gieok unreachable: an error by default; with onError the model still answers, without memory", async () => {
  const away = new Client({ baseUrl: await closedUrl(), apiKey: KEY, retries: 0 });
  const strict = wrapLanguageModel({ model: base, middleware: gieokMiddleware({ client: away, channel: "c", user: "u" }) });
  await assert.rejects(generateText({ model: strict, prompt: "hello", maxRetries: 0 }), ServerUnavailableError);

  const failures = [];
  const lenient = wrapLanguageModel({ model: base, middleware: gieokMiddleware({
    client: away, channel: "c", user: "u", onError: (error, stage) => failures.push([stage, error.name]) }) });
  const sent = model.received.length;
  const result = await generateText({ model: lenient, instructions: "Be brief.", prompt: "hello" });
  assert.equal(result.text, "보리는 츄르를 제일 좋아한다고 했어요.");
  assert.equal(model.system(sent), "Be brief.");
  assert.deepEqual(failures, [["context", "ServerUnavailableError"], ["record", "ServerUnavailableError"]]);
});

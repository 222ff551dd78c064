#!/usr/bin/env node
// What the TypeScript client costs over bare `fetch`, in an agent loop against `gieok serve`:
// add the user's message, get the context, call the model, add its answer — once with the client
// (clients/typescript), once with the same requests made by hand with Node's `fetch` (the same
// JSON, headers and Idempotency-Key), alternating loop by loop over two conversations that grow
// alike, so both meet the same server. The model is a loopback OpenAI-compatible server in this
// process, called with bare `fetch` in both. Target: the client adds ≤ 2 ms to a loop's gieok
// calls (p50 over the loops).
//
//   npm --prefix clients/typescript ci && npm --prefix clients/typescript run build
//   node benchmarks/ts_client_overhead.mjs --loops 200 --json bench-results/ts-client-overhead.json
//
// Without GIEOK_URL and GIEOK_API_KEY it starts its own `gieok serve` (the repository's
// .venv/bin/gieok, else `gieok` on PATH; GIEOK_BIN names another) on a fresh database in a
// temporary folder, and stops it at the end.

import { spawn, spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { cpus, tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const DIST = join(REPO, "clients", "typescript", "dist", "index.js");
const TARGET_MS = 2;
const WARMUP = 10;
const LINES = ["우리 고양이 보리는 츄르를 제일 좋아해", "What does Bori like to eat?", "다음 주에 부산 가는데 추천해 줘",
               "I moved to Berlin last month", "보리 병원은 언제 가야 해?"];

const { values: args } = parseArgs({ options: { loops: { type: "string", default: "200" }, json: { type: "string" } } });
const LOOPS = Number(args.loops);
if (!Number.isInteger(LOOPS) || LOOPS < 10) fail(`--loops must be a whole number, 10 or more, not ${args.loops}`);
if (!existsSync(DIST)) {
  fail(`the client is not built (${DIST}): npm --prefix clients/typescript ci && npm --prefix clients/typescript run build`);
}
const { Client } = await import(DIST);

function fail(message) {
  console.error(`error: ${message}`);
  process.exit(1);
}

// -- a gieok server: the one named in the environment, or our own -------------------------------
async function ownServer() {
  const bin = process.env.GIEOK_BIN ?? (existsSync(join(REPO, ".venv", "bin", "gieok")) ? join(REPO, ".venv", "bin", "gieok") : "gieok");
  const folder = mkdtempSync(join(tmpdir(), "gieok-ts-bench-"));
  const db = join(folder, "bench.db");
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("GIEOK_")));
  const made = spawnSync(bin, ["keys", "create", "--tenant", "default", "--role", "write", "--db", db, "--json"],
                         { env, encoding: "utf8" });
  if (made.status !== 0) fail(`${bin} keys create failed: ${made.stderr || made.error}`);
  const port = await new Promise((done) => {
    const probe = createServer().listen(0, "127.0.0.1", () => {
      const { port: free } = probe.address();
      probe.close(() => done(free));
    });
  });
  const child = spawn(bin, ["serve", "--db", db, "--port", String(port)], { env, stdio: "ignore" });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 180_000;
  for (;;) {
    if (child.exitCode !== null) fail(`${bin} serve exited (${child.exitCode})`);
    if (await fetch(`${url}/readyz`).then((r) => r.ok, () => false)) break;
    if (Date.now() > deadline) fail("gieok serve was not ready in 180 s");
    await new Promise((done) => setTimeout(done, 200));
  }
  return {
    url, key: JSON.parse(made.stdout).key,
    stop: async () => {
      child.kill("SIGTERM");
      await new Promise((done) => (child.exitCode !== null ? done() : child.once("exit", done)));
      rmSync(folder, { recursive: true, force: true });
    },
  };
}

// -- a loopback OpenAI-compatible model ----------------------------------------------------------
async function loopbackModel() {
  const answer = JSON.stringify({ id: "c", object: "chat.completion", created: 1, model: "bench",
    choices: [{ index: 0, message: { role: "assistant", content: "보리는 츄르를 좋아한다고 했어요. Noted." }, finish_reason: "stop" }] });
  const server = createServer((request, response) => {
    request.resume();
    request.on("end", () => response.writeHead(200, { "Content-Type": "application/json" }).end(answer));
  });
  await new Promise((done) => server.listen(0, "127.0.0.1", done));
  return { url: `http://127.0.0.1:${server.address().port}/v1/chat/completions`, close: () => server.close() };
}

async function callModel(url, system, line) {
  const response = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: "bench", messages: [{ role: "system", content: system }, { role: "user", content: line }] }) });
  return (await response.json()).choices[0].message.content;
}

// -- the two loops ------------------------------------------------------------------------------
function bareGieok(url, key) {
  const send = async (path, body, write) => {
    const headers = { Accept: "application/json", Authorization: `Bearer ${key}`, "Content-Type": "application/json" };
    if (write) headers["Idempotency-Key"] = randomUUID();
    const response = await fetch(url + path, { method: "POST", headers, body: JSON.stringify(body) });
    const data = await response.json();
    if (!response.ok) throw new Error(`${path}: ${response.status} ${JSON.stringify(data)}`);
    return data;
  };
  return {
    add: (channel, message) => send("/v1/conversations/messages", { channel, messages: [message] }, true),
    context: (channel, user, query) => send("/v1/conversations/context", { channel, user, query, budget_tokens: 2000 }, false),
  };
}

function clientGieok(url, key) {
  const memory = new Client({ baseUrl: url, apiKey: key });
  return {
    add: (channel, message) => memory.addMessages(channel, [message]),
    context: (channel, user, query) => memory.context(channel, { user, query }),
  };
}

/**
 * One agent loop for each variant, step by step: each step runs for both (in an order that
 * alternates loop by loop), so the two samples of a step meet the server in the same state.
 */
async function loops(variants, channels, model, n) {
  const line = LINES[n % LINES.length];
  const order = n % 2 ? ["client", "bare"] : ["bare", "client"];
  const times = { bare: {}, client: {} };
  const step = async (name, work) => {
    const results = {};
    for (const variant of order) {
      const started = performance.now();
      results[variant] = await work(variants[variant], channels[variant], variant);
      times[variant][name] = performance.now() - started;
    }
    return results;
  };
  await step("add_user", (gieok, channel) =>
    gieok.add(channel, { id: `u${n}`, role: "user", text: line, user: "u-minji", name: "민지" }));
  const contexts = await step("context", (gieok, channel) => gieok.context(channel, "u-minji", line));
  const answers = {};
  for (const variant of order) { // the same bare fetch in both: the model is not what is compared
    const started = performance.now();
    answers[variant] = await callModel(model.url, `You are a friendly assistant.\n\n${contexts[variant].text}`, line);
    times[variant].model = performance.now() - started;
  }
  await step("add_answer", (gieok, channel, variant) =>
    gieok.add(channel, { id: `a${n}`, role: "assistant", text: answers[variant], name: "bot" }));
  for (const sample of Object.values(times)) sample.gieok_calls = sample.add_user + sample.context + sample.add_answer;
  return times;
}

/**
 * The client's own work per call, without a network: both sides get the same canned answer from
 * a `fetch` that does not connect, so what differs is what the client does around it (building
 * the request, its Idempotency-Key and deadline, reading the answer into typed results).
 */
async function ownWork(answerText) {
  const canned = async () => new Response(answerText, { status: 200, headers: { "Content-Type": "application/json" } });
  const client = new Client({ baseUrl: "http://127.0.0.1:1", apiKey: "gk_bench", fetch: canned });
  const body = { channel: "c", user: "u-minji", query: LINES[0], budget_tokens: 2000 };
  const bare = async () => {
    const response = await canned("http://127.0.0.1:1/v1/conversations/context", {
      method: "POST", body: JSON.stringify(body),
      headers: { Accept: "application/json", Authorization: "Bearer gk_bench", "Content-Type": "application/json" } });
    return response.json();
  };
  const viaClient = () => client.context("c", { user: "u-minji", query: LINES[0] });
  const measure = async (call) => {
    for (let i = 0; i < 2000; i += 1) await call(); // warm the JIT
    const samples = [];
    for (let i = 0; i < 20_000; i += 1) {
      const started = performance.now();
      await call();
      samples.push((performance.now() - started) * 1000);
    }
    return { p50_us: round(percentile(samples, 0.5)), p95_us: round(percentile(samples, 0.95)) };
  };
  return { bare: await measure(bare), client: await measure(viaClient) };
}

function percentile(values, p) {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (sorted.length - 1) * p;
  const low = Math.floor(at);
  return sorted[low] + (sorted[Math.ceil(at)] - sorted[low]) * (at - low);
}

const round = (ms) => Math.round(ms * 1000) / 1000;

async function main() {
  const given = process.env.GIEOK_URL && (process.env.GIEOK_API_KEY || process.env.GIEOK_KEY);
  const server = given ? { url: process.env.GIEOK_URL, key: process.env.GIEOK_API_KEY || process.env.GIEOK_KEY, stop: async () => {} }
    : await ownServer();
  const model = await loopbackModel();
  const run = randomUUID().slice(0, 8);
  const variants = { bare: bareGieok(server.url, server.key), client: clientGieok(server.url, server.key) };
  const channels = { bare: `bench-${run}-bare`, client: `bench-${run}-client` };
  const samples = { bare: [], client: [] };
  let lastContext = "";
  try {
    for (let n = 0; n < WARMUP + LOOPS; n += 1) {
      const times = await loops(variants, channels, model, n);
      if (n < WARMUP) continue;
      samples.bare.push(times.bare);
      samples.client.push(times.client);
    }
    lastContext = JSON.stringify(await bareGieok(server.url, server.key).context(channels.bare, "u-minji", LINES[0]));
  } finally {
    model.close();
    await server.stop();
  }
  const calls = ["add_user", "context", "model", "add_answer", "gieok_calls"];
  const result = { benchmark: "ts_client_overhead", loops: LOOPS, warmup_loops: WARMUP, node: process.version,
                   cpus: cpus().length, target_ms: TARGET_MS, calls: {} };
  const header = ["call", "bare p50", "bare p95", "client p50", "client p95", "diff p50", "paired diff p50"];
  const rows = [];
  for (const call of calls) {
    const bare = samples.bare.map((t) => t[call]);
    const client = samples.client.map((t) => t[call]);
    const paired = client.map((ms, i) => ms - bare[i]);
    const row = {
      bare: { p50: round(percentile(bare, 0.5)), p95: round(percentile(bare, 0.95)) },
      client: { p50: round(percentile(client, 0.5)), p95: round(percentile(client, 0.95)) },
      diff_p50: round(percentile(client, 0.5) - percentile(bare, 0.5)),
      paired_diff_p50: round(percentile(paired, 0.5)),
    };
    result.calls[call] = row;
    rows.push([call, row.bare.p50, row.bare.p95, row.client.p50, row.client.p95, row.diff_p50, row.paired_diff_p50]
      .map((cell) => (typeof cell === "number" ? cell.toFixed(2) : cell)));
  }
  const overhead = result.calls.gieok_calls.diff_p50;
  result.own_work_per_context_call = await ownWork(lastContext);
  result.met = overhead <= TARGET_MS;
  const widths = header.map((title, i) => Math.max(title.length, ...rows.map((row) => row[i].length)));
  const line = (cells) => cells.map((cell, i) => (i ? cell.padStart(widths[i]) : cell.padEnd(widths[i]))).join("  ");
  console.log(`TypeScript client vs bare fetch: ${LOOPS} agent loops each (ms; ${process.version}, ${cpus().length} CPUs)`);
  console.log(line(header));
  for (const row of rows) console.log(line(row));
  console.log(`the client's cost per loop (p50 of its gieok calls, client − bare): ${overhead.toFixed(2)} ms; `
              + `target ≤ ${TARGET_MS} ms ${result.met ? "met" : "missed"}`);
  const own = result.own_work_per_context_call;
  console.log(`its own work per context call, no network (p50 / p95): client ${own.client.p50_us.toFixed(1)} / `
              + `${own.client.p95_us.toFixed(1)} µs, bare fetch ${own.bare.p50_us.toFixed(1)} / ${own.bare.p95_us.toFixed(1)} µs`);
  if (args.json) {
    writeFileSync(args.json, `${JSON.stringify(result, null, 2)}\n`);
    console.log(`wrote ${args.json}`);
  }
}

await main();

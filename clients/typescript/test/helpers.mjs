// What the tests share: the server and keys tests/test_typescript_client.py hands over in the
// environment (a real `gieok serve` on loopback, keys of two tenants), fresh conversation names,
// a loopback proxy that can drop or cut a connection, and a loopback OpenAI-compatible model.

import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import net from "node:net";

export const URL = process.env.GIEOK_URL;
export const KEY = process.env.GIEOK_API_KEY; // tenant "default", role write
export const READ_KEY = process.env.GIEOK_READ_KEY; // tenant "default", role read
export const ADMIN_KEY = process.env.GIEOK_ADMIN_KEY; // tenant "default", role admin
export const OTHER_KEY = process.env.GIEOK_OTHER_TENANT_KEY; // tenant "acme", role write
if (!URL || !KEY || !READ_KEY || !ADMIN_KEY || !OTHER_KEY) {
  throw new Error("run by tests/test_typescript_client.py: GIEOK_URL, GIEOK_API_KEY, GIEOK_READ_KEY, GIEOK_ADMIN_KEY "
                  + "and GIEOK_OTHER_TENANT_KEY name a running gieok serve and its keys");
}

if (net.Socket.prototype.connect.name !== "connectLoopbackOnly") {
  throw new Error("run with NODE_OPTIONS=--import=<test/loopback-only.mjs>: the tests must prove they stay on this machine");
}

export const FAST = { retries: 3, backoffMs: 10 };

/** A loopback URL where nothing listens (a port that was free a moment ago). */
export async function closedUrl() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return `http://127.0.0.1:${port}`;
}

export function channelName(prefix = "cafe") {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}

/** Until `check()` is truthy (its value), or an error after `ms`. */
export async function eventually(check, ms = 5000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error("eventually: not within the time");
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/**
 * A loopback TCP proxy to `target` (a URL). Connection n (from 0) follows `script[n]` while there
 * is one, and every later connection is piped through:
 * - "drop-answer": the request goes to the server, its whole answer is read, then the client's
 *   connection is closed without it (the write happened; the client never hears so);
 * - "refuse": the connection is closed at once;
 * - "cut-after-first-event": piped, but closed once the server has sent its first SSE event;
 * - a string starting "HTTP/1.1": those bytes are the answer (the server is not asked).
 * `requests` keeps each connection's request head, to read what each attempt sent.
 */
export async function startProxy(target, script = []) {
  const { hostname, port } = new globalThis.URL(target);
  const requests = [];
  const answers = [];
  const sockets = new Set();
  let connection = 0;
  const server = net.createServer((client) => {
    sockets.add(client);
    client.on("close", () => sockets.delete(client));
    client.on("error", () => undefined);
    const step = script[connection];
    const number = connection;
    connection += 1;
    let head = "";
    client.on("data", (chunk) => {
      if (requests[number] === undefined) requests[number] = "";
      head = (head + chunk.toString("latin1")).slice(0, 65536);
      requests[number] = head;
    });
    if (step === "refuse") {
      client.destroy();
      return;
    }
    if (typeof step === "string" && step.startsWith("HTTP/1.1")) {
      client.once("data", () => client.end(step));
      return;
    }
    const upstream = net.connect({ host: hostname, port: Number(port) });
    sockets.add(upstream);
    upstream.on("close", () => sockets.delete(upstream));
    upstream.on("error", () => client.destroy());
    client.on("error", () => upstream.destroy());
    client.pipe(upstream);
    if (step === "drop-answer") {
      let answer = "";
      upstream.on("data", (chunk) => {
        answer += chunk.toString("latin1");
        const [headers, body = ""] = answer.split("\r\n\r\n", 2);
        const length = Number(/content-length:\s*(\d+)/i.exec(headers)?.[1] ?? NaN);
        if (body.length >= length) { // the whole answer arrived: the server did the work
          answers[number] = answer;
          client.destroy();
          upstream.destroy();
        }
      });
      return;
    }
    if (step === "cut-after-first-event") { // forward up to the end of the first event with an id, then cut
      let seen = "";
      let sent = 0;
      upstream.on("data", (chunk) => {
        seen += chunk.toString("latin1");
        const id = /\nid: \d+\n/.exec(seen);
        const end = id ? seen.indexOf("\n\n", id.index + 1) : -1;
        const upTo = end >= 0 ? end + 2 : seen.length;
        client.write(Buffer.from(seen.slice(sent, upTo), "latin1"));
        sent = upTo;
        if (end >= 0) {
          client.destroy();
          upstream.destroy();
        }
      });
      return;
    }
    upstream.on("data", (chunk) => { answers[number] = ((answers[number] ?? "") + chunk.toString("latin1")).slice(0, 65536); });
    upstream.pipe(client);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    answers,
    /** The Idempotency-Key each connection's request carried. */
    idempotencyKeys: () => requests.map((head) => /\r\nidempotency-key:\s*(\S+)\r\n/i.exec(head ?? "")?.[1]),
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/**
 * A loopback OpenAI-compatible chat model (`POST /v1/chat/completions`, plain or streamed) that
 * answers `reply(body)` and keeps every request body (`received`), to see what the model was sent.
 */
export async function startModel(reply = () => "네, 기억할게요. Noted.") {
  const received = [];
  const server = createServer((request, response) => {
    let raw = "";
    request.setEncoding("utf8");
    request.on("data", (chunk) => { raw += chunk; });
    request.on("end", () => {
      if (request.method !== "POST" || !request.url.endsWith("/chat/completions")) {
        response.writeHead(404, { "Content-Type": "application/json" }).end('{"error": {"message": "no such route"}}');
        return;
      }
      const body = JSON.parse(raw);
      received.push(body);
      const text = reply(body);
      const base = { id: "chatcmpl-1", created: 1, model: body.model };
      if (!body.stream) {
        response.writeHead(200, { "Content-Type": "application/json" });
        response.end(JSON.stringify({ ...base, object: "chat.completion",
          choices: [{ index: 0, message: { role: "assistant", content: text }, finish_reason: "stop" }],
          usage: { prompt_tokens: 11, completion_tokens: 7, total_tokens: 18 } }));
        return;
      }
      response.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
      const chunk = (delta, finish = null) => `data: ${JSON.stringify({ ...base, object: "chat.completion.chunk",
        choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
      response.write(chunk({ role: "assistant", content: "" }));
      for (const piece of text.match(/.{1,4}/gsu) ?? []) response.write(chunk({ content: piece }));
      response.write(chunk({}, "stop"));
      response.end("data: [DONE]\n\n");
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/v1`,
    received,
    /** The system prompt of the n-th request (the system messages' text). */
    system: (n) => received[n].messages.filter((m) => m.role === "system").map((m) => contentText(m.content)).join("\n"),
    close: () => new Promise((resolve) => { server.closeAllConnections?.(); server.close(resolve); }),
  };
}

function contentText(content) {
  return typeof content === "string" ? content : content.map((part) => part.text ?? "").join("");
}

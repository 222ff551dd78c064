// Preloaded into every test process (NODE_OPTIONS=--import): a TCP connection to anything but
// this machine throws, so a test that passes made no request off the machine — no telemetry, no
// model or tokenizer download, nothing the AI SDK or its providers might fetch by themselves.

import net from "node:net";

const LOOPBACK = /^(127\.\d+\.\d+\.\d+|::1|localhost|::ffff:127\.\d+\.\d+\.\d+)$/i;
const connect = net.Socket.prototype.connect;

net.Socket.prototype.connect = function connectLoopbackOnly(...args) {
  const first = args[0];
  const options = Array.isArray(first) ? first[0] : first;
  const target = typeof options === "object" && options !== null
    ? options.path ?? options.host ?? "localhost"
    : typeof options === "string" && !/^\d+$/.test(options) ? options : args[1] ?? "localhost";
  const local = typeof options === "object" && options?.path !== undefined;
  if (!local && !LOOPBACK.test(String(target).replace(/^\[|\]$/g, ""))) {
    throw new Error(`offline test: a connection to ${target} was attempted; only loopback is allowed`);
  }
  return connect.apply(this, args);
};

/**
 * The one request path of the client, with the Python client's policy (gieok/client/_http.py):
 * which failures are retried (a refused, reset or timed-out connection, a 503), how long to wait
 * (exponential backoff with jitter, or what Retry-After asks), the Idempotency-Key every write
 * carries — minted once per call and sent unchanged on each retry — and which error an answer
 * becomes (`errorFor`). The methods (client.ts) only describe their requests as `Call`s.
 */

import {
  AuthenticationError,
  BlockNotFoundError,
  EmbedderError,
  type ErrorEnvelope,
  type GieokError,
  InvalidInputError,
  LLMError,
  NotFoundError,
  PermissionDeniedError,
  ServerError,
  ServerUnavailableError,
  StorageFullError,
  StoreError,
} from "./errors.js";
import { VERSION } from "./version.js";

export const DEFAULT_URL = "http://127.0.0.1:8420";
export const IDEMPOTENCY_HEADER = "Idempotency-Key";
const MAX_BACKOFF_MS = 30_000; // one exponential wait never grows past this
const MAX_RETRY_AFTER_MS = 60_000; // a server asking for longer is waited on this long, then asked again
const NO_ROUTE = "Not Found"; // Starlette's message for a path no route matches

/** Error codes of a connection that failed or was cut: the request may not have arrived, or its answer was lost. */
const RETRYABLE_CODES = new Set([
  "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EPIPE", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH", "ENETDOWN",
  "EAI_AGAIN", "ENOTFOUND", "UND_ERR_SOCKET", "UND_ERR_CLOSED", "UND_ERR_CONNECT_TIMEOUT", "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
]);

export type Method = "GET" | "POST" | "PATCH" | "DELETE";

/**
 * One logical request. `write`: it changes the memory, so it carries an Idempotency-Key. `accept`:
 * error statuses that are an answer, not a failure (503 for `/readyz`). `block`: the block a 404
 * is about. `retries`: this call's own limit (undefined: the client's).
 */
export interface Call {
  method: Method;
  path: string;
  body?: unknown;
  params?: ReadonlyArray<readonly [string, string]>;
  write?: boolean;
  auth?: boolean;
  accept?: readonly number[];
  block?: number;
  retries?: number;
  signal?: AbortSignal | undefined;
}

/** A whole answer: the status, the headers and the body's text (read inside the attempt, so a cut body is retried too). */
export interface Answer {
  status: number;
  headers: Headers;
  text: string;
}

export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

export interface ConnectionSettings {
  baseUrl: string;
  apiKey: string | undefined;
  retries: number;
  backoffMs: number;
  timeoutMs: number;
  fetch: FetchLike;
}

/** Where the server is and how hard to try: what every call of one client shares. */
export class Connection {
  readonly baseUrl: string;
  readonly apiKey: string | undefined;
  readonly retries: number;
  readonly backoffMs: number;
  readonly timeoutMs: number;
  private readonly fetch: FetchLike;

  constructor(settings: ConnectionSettings) {
    const { baseUrl, retries, backoffMs, timeoutMs } = settings;
    if (typeof baseUrl !== "string" || !/^https?:\/\//.test(baseUrl)) {
      throw new InvalidInputError(`baseUrl must be an http:// or https:// URL, not ${JSON.stringify(baseUrl)}`);
    }
    if (!Number.isInteger(retries) || retries < 0) {
      throw new InvalidInputError(`retries must be a whole number, 0 or more, not ${String(retries)}`);
    }
    if (typeof backoffMs !== "number" || !(backoffMs >= 0)) {
      throw new InvalidInputError(`backoffMs must be milliseconds, 0 or more, not ${String(backoffMs)}`);
    }
    if (typeof timeoutMs !== "number" || !(timeoutMs > 0)) {
      throw new InvalidInputError(`timeoutMs must be milliseconds, more than 0, not ${String(timeoutMs)}`);
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.apiKey = settings.apiKey || undefined;
    this.retries = retries;
    this.backoffMs = backoffMs;
    this.timeoutMs = timeoutMs;
    this.fetch = settings.fetch;
  }

  /** Send `call`, retrying connection failures and 503s up to the retry limit; the 2xx (or accepted) answer, or the error the failure maps to. */
  async send(call: Call): Promise<Answer> {
    return (await this.exchange(call, false)) as Answer;
  }

  /**
   * Open a streaming answer (`GET /v1/events`): the same retries and errors as `send`, but the
   * deadline covers the answer's headers only, and the body is the caller's to read (`call.signal` ends it).
   */
  async open(call: Call): Promise<Response> {
    return (await this.exchange(call, true)) as Response;
  }

  private async exchange(call: Call, stream: boolean): Promise<Answer | Response> {
    const url = this.url(call);
    const init = this.init(call, stream); // the Idempotency-Key is minted here, once: every attempt sends the same
    const retries = call.retries ?? this.retries;
    for (let attempt = 1; ; attempt += 1) {
      const deadline = new AbortController();
      let expired = false;
      const timer = setTimeout(() => {
        expired = true;
        deadline.abort();
      }, this.timeoutMs);
      let answer: Answer | undefined;
      let failure: unknown;
      try {
        const signal = call.signal ? anySignal([call.signal, deadline.signal]) : deadline.signal;
        const response = await this.fetch(url, { ...init, signal });
        if (stream && response.ok) return response;
        answer = { status: response.status, headers: response.headers, text: await response.text() };
      } catch (error) {
        failure = expired ? new TimeoutFailure(`no answer within ${this.timeoutMs} ms (the client's timeoutMs)`) : error;
      } finally {
        clearTimeout(timer);
      }
      if (answer !== undefined) {
        const status = answer.status;
        if ((status >= 200 && status < 300) || call.accept?.includes(status)) return answer;
        if (status === 503 && attempt <= retries) {
          await sleep(this.delay(attempt, retryAfterMs(answer.headers)), call.signal);
          continue;
        }
        throw errorFor(answer, call, this.baseUrl, attempt);
      }
      if (call.signal?.aborted) throw call.signal.reason ?? failure;
      if (!networkFailure(failure)) throw failure; // not the connection's doing: a bug, or a custom fetch's own error
      if (retryable(failure) && attempt <= retries) {
        await sleep(this.delay(attempt, undefined), call.signal);
        continue;
      }
      const tried = attempt > 1 ? ` (tried ${attempt} times)` : "";
      throw new ServerUnavailableError(`cannot reach the gieok server at ${this.baseUrl} (${call.method} ${call.path}): `
                                       + `${describe(failure)}${tried}`, { cause: failure });
    }
  }

  /**
   * How long to wait before retry number `attempt` (1, 2, …), in ms: what the server asked for
   * (Retry-After), else exponential backoff with jitter, so that clients failing together do not
   * come back together.
   */
  delay(attempt: number, retryAfter: number | undefined): number {
    if (retryAfter !== undefined) return Math.min(retryAfter, MAX_RETRY_AFTER_MS);
    return Math.min(this.backoffMs * 2 ** (attempt - 1), MAX_BACKOFF_MS) * (0.5 + Math.random() * 0.5);
  }

  private url(call: Call): string {
    const query = call.params?.length ? `?${new URLSearchParams(call.params.map(([k, v]): [string, string] => [k, v]))}` : "";
    return `${this.baseUrl}${call.path}${query}`;
  }

  private init(call: Call, stream: boolean): RequestInit {
    const headers: Record<string, string> = { Accept: stream ? "text/event-stream" : "application/json",
                                              "User-Agent": `gieok-js/${VERSION}` };
    if (call.auth ?? true) {
      if (!this.apiKey) {
        throw new AuthenticationError(`no API key for the gieok server at ${this.baseUrl}: pass apiKey or set GIEOK_API_KEY `
                                      + "(or GIEOK_KEY); `gieok keys create --db <the server's --db>` makes one");
      }
      headers.Authorization = `Bearer ${this.apiKey}`;
    }
    if (call.write) headers[IDEMPOTENCY_HEADER] = randomId();
    if (call.body === undefined) return { method: call.method, headers };
    headers["Content-Type"] = "application/json";
    return { method: call.method, headers, body: jsonBody(call) };
  }
}

/** The JSON of a body; a value JSON cannot carry (NaN, Infinity, a BigInt, a cycle) is refused before sending, as the server would refuse it. */
function jsonBody(call: Call): string {
  try {
    return JSON.stringify(call.body, (_key, value: unknown) => {
      if (typeof value === "number" && !Number.isFinite(value)) throw new TypeError(`${value} is not a JSON number`);
      return value;
    });
  } catch (error) {
    throw new InvalidInputError(`${call.method} ${call.path}: the request cannot be sent as JSON: ${describe(error)}`);
  }
}

/** Abort when any of `signals` does (AbortSignal.any where the runtime has it). */
export function anySignal(signals: AbortSignal[]): AbortSignal {
  if (typeof AbortSignal.any === "function") return AbortSignal.any(signals);
  const joined = new AbortController();
  for (const signal of signals) {
    if (signal.aborted) {
      joined.abort(signal.reason);
      break;
    }
    signal.addEventListener("abort", () => joined.abort(signal.reason), { once: true });
  }
  return joined.signal;
}

class TimeoutFailure extends Error {
  override readonly name = "TimeoutError";
}

function errorCode(error: unknown): string | undefined {
  let current = error;
  for (let depth = 0; current && depth < 4; depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/** A failure of the connection (fetch's TypeError and its causes, a timeout), as opposed to a bug. */
export function networkFailure(error: unknown): boolean {
  return error instanceof TimeoutFailure || error instanceof TypeError || errorCode(error) !== undefined;
}

/**
 * Failures where the request may not have reached the server, or its answer was lost: refused
 * or reset connections, cut answers and timeouts. A malformed URL or a certificate the client
 * refuses is not.
 */
function retryable(error: unknown): boolean {
  if (error instanceof TimeoutFailure) return true;
  const code = errorCode(error);
  if (code !== undefined) return RETRYABLE_CODES.has(code);
  return error instanceof TypeError && /terminated|other side closed|fetch failed/i.test(error.message);
}

function describe(error: unknown): string {
  const own = error instanceof Error ? error.message : String(error);
  const cause = (error as { cause?: unknown } | undefined)?.cause;
  const deeper = cause instanceof Error && cause.message && cause.message !== own ? `: ${cause.message}` : "";
  const code = errorCode(error);
  const said = `${own}${deeper}`;
  return code && !said.includes(code) ? `${said} (${code})` : said;
}

export async function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  if (signal?.aborted) throw signal.reason;
  await new Promise<void>((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Retry-After in milliseconds (either form: a number of seconds or an HTTP date), or undefined. */
export function retryAfterMs(headers: Headers): number | undefined {
  const value = headers.get("Retry-After");
  if (!value) return undefined;
  const seconds = Number(value);
  if (value.trim() !== "" && Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const when = Date.parse(value);
  return Number.isNaN(when) ? undefined : Math.max(0, when - Date.now());
}

/** (type, message, envelope) of an error answer; a body that is not the envelope (a proxy's page) gives its start. */
function envelopeOf(answer: Answer): [string, string, ErrorEnvelope | undefined] {
  let data: unknown;
  try {
    data = JSON.parse(answer.text);
  } catch {
    data = undefined;
  }
  const error = (data as { error?: unknown } | undefined)?.error;
  if (error && typeof error === "object" && typeof (error as ErrorEnvelope).message === "string") {
    const envelope = error as ErrorEnvelope;
    return [String(envelope.type ?? ""), envelope.message as string, envelope];
  }
  const text = answer.text.trim().slice(0, 200);
  return ["", `HTTP ${answer.status}${text ? `: ${text}` : ""}`, undefined];
}

/** The error an error answer means: the status (and, for a 503, the error type) picks the class; the message is the server's own. */
export function errorFor(answer: Answer, call: Pick<Call, "method" | "path" | "block">, baseUrl: string,
                         attempts = 1): GieokError {
  const status = answer.status;
  const [type, message, envelope] = envelopeOf(answer);
  const init = { status, type, envelope };
  switch (status) {
    case 401: return new AuthenticationError(message, init);
    case 403: return new PermissionDeniedError(message, init);
    case 400: case 422: return new InvalidInputError(message, init);
    case 413: return new InvalidInputError(`the request body was too large for the server: ${message}`, init);
    case 502: return new LLMError(message, init);
    case 507: return new StorageFullError(message, init);
    case 404:
      if (message === NO_ROUTE) {
        return new NotFoundError(`${call.method} ${call.path}: the server at ${baseUrl} has no such route `
                                 + "(is it older than this client?)", init);
      }
      return call.block !== undefined ? new BlockNotFoundError(message, init) : new NotFoundError(message, init);
    case 503: {
      if (type === "store_unavailable") return new StoreError(message, init);
      if (type === "embedder_unavailable") return new EmbedderError(message, init);
      const tried = attempts > 1 ? ` after ${attempts} attempts` : "";
      return new ServerUnavailableError(`the gieok server at ${baseUrl} is unavailable (503${tried}): ${message}`, init);
    }
    case 405:
      return new ServerError(`${call.method} ${call.path}: the server at ${baseUrl} does not take this method here `
                             + `(is it older than this client?): ${message}`, init);
    default:
      return new ServerError(`${call.method} ${call.path}: ${status} ${type || "error"}: ${message}`, init);
  }
}

/** The JSON of a 2xx answer; one that is not JSON is the server's failure, said so. */
export function jsonOf(answer: Answer, call: Pick<Call, "method" | "path">): unknown {
  try {
    return JSON.parse(answer.text);
  } catch {
    throw new ServerError(`${call.method} ${call.path}: the server answered ${answer.status} with a body that is not JSON`,
                          { status: answer.status });
  }
}

/**
 * A random UUID (an Idempotency-Key, a message id): Web Crypto's where the runtime has it (Node 19+,
 * browsers, edge runtimes); on one without (Node 18) one made of Math.random, which is unique
 * enough to tell one request from another, the only thing these ids are for.
 */
export function randomId(): string {
  const crypto = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  if (typeof crypto?.randomUUID === "function") return crypto.randomUUID();
  const hex = Array.from({ length: 32 }, () => Math.floor(Math.random() * 16).toString(16));
  hex[12] = "4";
  hex[16] = (8 + Math.floor(Math.random() * 4)).toString(16);
  const text = hex.join("");
  return `${text.slice(0, 8)}-${text.slice(8, 12)}-${text.slice(12, 16)}-${text.slice(16, 20)}-${text.slice(20)}`;
}

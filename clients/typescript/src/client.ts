/**
 * `Client`: `gieok serve`'s REST API with the Python client's calls, in its order, camel-cased
 * (gieok/client/_sync.py). Each method checks what must hold before its first request, describes
 * its requests (`Call`) and reads the answers; sending, retrying and turning refusals into errors
 * is http.ts's.
 */

import { streamEvents, type EventsOptions } from "./events.js";
import { InvalidInputError, InvalidTypeError, ServerError, ServerUnavailableError } from "./errors.js";
import { type Call, Connection, DEFAULT_URL, type FetchLike, jsonOf, sleep } from "./http.js";
import {
  type Block, type BlockPage, type Context, type ContextPart, type Fact, type FactChange, type GieokEvent,
  type JsonObject, type Message, type MessagesResult, type Scope, type SearchResult, type ServerStats,
  type UsersPage, type VerifyReport, type When, mergeMessagesResults, readBlock, readBlockPage, readContext, readFact,
  readFactChange, readMessagesResult, readObject, readSearchResult, readStats, readUsersPage, readVerifyReport,
  ShapeError,
} from "./types.js";

export const MAX_BATCH = 256; // blocks per POST /v1/memories:batch (the server's limit: one transaction)
export const MAX_MESSAGES = 256; // messages per POST /v1/conversations/messages

export interface ClientOptions {
  /** The server; default `$GIEOK_URL`, else http://127.0.0.1:8420. */
  baseUrl?: string;
  /** The key (`gk_…`); default `$GIEOK_API_KEY`, else `$GIEOK_KEY`. */
  apiKey?: string;
  /** How long one attempt may wait for its whole answer (a write is answered once its texts are embedded). Default 300,000. */
  timeoutMs?: number;
  /** Retries of a refused, reset or timed-out connection and of a 503. Default 3. */
  retries?: number;
  /** The first retry's wait, doubling each time, with jitter (a 503's Retry-After wins). Default 500. */
  backoffMs?: number;
  /** The fetch to send with (a proxy's, a test's); default the runtime's own. */
  fetch?: FetchLike;
}

/** What every method takes: `signal` aborts the call (and its retries). */
export interface CallOptions {
  signal?: AbortSignal;
}

/** One block to remember (`add`, `addMany`). */
export interface MemoryItem {
  text: string;
  kind?: string;
  scope?: Scope;
  speaker?: string;
  importance?: number;
  eventTime?: When;
  tags?: readonly string[];
  keywords?: readonly string[];
  metadata?: JsonObject;
}

export type AddOptions = Omit<MemoryItem, "text"> & CallOptions;

export interface ListBlocksOptions extends CallOptions {
  scope?: Scope;
  kinds?: readonly string[] | string;
  since?: When;
  until?: When;
  /** At most 200; default 50. */
  limit?: number;
  /** `next_cursor` of the last page. */
  cursor?: string;
}

export interface SearchOptions extends CallOptions {
  /** Hits wanted, 1–100; default 10. */
  k?: number;
  scope?: Scope;
  kinds?: readonly string[] | string;
  since?: When;
  until?: When;
  mode?: "hybrid" | "bm25" | "vector";
  neighbours?: boolean;
}

export interface FactsOptions extends CallOptions {
  user?: string;
  guild?: string;
  /** Superseded facts too. */
  history?: boolean;
  limit?: number;
  /** Those true then, on the conversation's clock. */
  asOf?: When;
  /** As the server knew them then. */
  knownAt?: When;
}

export interface AddFactOptions extends CallOptions {
  user?: string;
  guild?: string;
  validFrom?: When;
  topic?: string;
}

export interface ConversationOptions extends CallOptions {
  guild?: string;
}

export interface AddMessagesOptions extends ConversationOptions {
  /** "now" (default): the turn blocks are written before the answer, so a search finds them at once. "behind": the answer comes once the messages are stored as recent messages (in the next context), their turn blocks just after — faster, for an agent loop whose next call is the context. */
  index?: "now" | "behind";
}

export interface ContextOptions extends CallOptions {
  guild?: string;
  /** Who the reply is for: their facts come in (without it, no user's private facts). */
  user?: string;
  /** What the reply is about; default the conversation's last user message. */
  query?: string;
  /** 100–32,000; default 2,000. */
  budgetTokens?: number;
  /** Which parts; default all. */
  include?: readonly ContextPart[];
}

export interface WaitReadyOptions extends CallOptions {
  timeoutMs?: number;
  intervalMs?: number;
}

type Params = Array<[string, string]>;

function environment(name: string): string | undefined {
  const env = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env;
  return env?.[name] || undefined;
}

function wireTime(value: When | null | undefined): number | string | undefined {
  if (value === undefined || value === null) return undefined;
  if (value instanceof Date) {
    if (Number.isNaN(value.getTime())) throw new InvalidInputError("a time is an invalid Date");
    return value.toISOString();
  }
  if (typeof value !== "number" && typeof value !== "string") {
    throw new InvalidTypeError(`a time must be epoch seconds, an ISO 8601 string or a Date, not ${typeof value}`);
  }
  return value;
}

const SCOPE_KEYS = ["guild", "channel", "user"] as const;

function wireScope(scope: Scope | null | undefined): Record<string, string> | undefined {
  if (scope === undefined || scope === null) return undefined;
  if (typeof scope !== "object" || Array.isArray(scope)) throw new InvalidTypeError("scope must be an object");
  const unknown = Object.keys(scope).filter((key) => !(SCOPE_KEYS as readonly string[]).includes(key));
  if (unknown.length) {
    throw new InvalidInputError(`unknown scope key(s) ${unknown.map((k) => `'${k}'`).join(", ")}; allowed: guild, channel, user`);
  }
  const out: Record<string, string> = {};
  for (const key of SCOPE_KEYS) {
    const value = scope[key];
    if (value === undefined || value === null || value === "") continue;
    if (typeof value !== "string" && typeof value !== "number") {
      throw new InvalidTypeError(`scope ${key} must be a string, not ${typeof value}`);
    }
    out[key] = String(value);
  }
  return out;
}

function wireKinds(kinds: readonly string[] | string | undefined): string[] | undefined {
  if (kinds === undefined) return undefined;
  return typeof kinds === "string" ? [kinds] : kinds.map(String);
}

function wireItem(item: string | MemoryItem, number: number): JsonObject {
  if (typeof item === "string") return { text: item };
  if (item === null || typeof item !== "object") {
    throw new InvalidTypeError(`item ${number} must be a text or an object, not ${item === null ? "null" : typeof item}`);
  }
  return withoutEmpty({
    text: item.text, kind: item.kind, scope: wireScope(item.scope), speaker: item.speaker, importance: item.importance,
    event_time: wireTime(item.eventTime), tags: item.tags && [...item.tags], keywords: item.keywords && [...item.keywords],
    metadata: item.metadata,
  });
}

/** One message for the wire. An id is never made up: the server keeps each id once, which is what makes a resent message harmless; an invented one would store it twice. */
function wireMessage(message: Message, number: number): JsonObject {
  if (message === null || typeof message !== "object") {
    throw new InvalidTypeError(`message ${number} must be an object ({id, role, text, user, name, time})`);
  }
  if (message.id === undefined || message.id === null || message.id === "") {
    throw new InvalidInputError(`message ${number} has no id: the server needs the transport's message id `
                                + "(it is what makes sending a message twice store it once)");
  }
  return withoutEmpty({ id: String(message.id), role: message.role, text: message.text, user: message.user,
                        name: message.name, time: wireTime(message.time) });
}

function withoutEmpty(object: JsonObject): JsonObject {
  return Object.fromEntries(Object.entries(object).filter(([, value]) => value !== undefined && value !== null));
}

function index(value: number, what = "block index"): number {
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new InvalidTypeError(`${what} must be an integer, not ${typeof value === "number" ? value : typeof value}`);
  }
  return value;
}

function pathPart(value: string, what: string): string {
  if (typeof value !== "string" || value === "") throw new InvalidTypeError(`${what} must be a non-empty string`);
  return encodeURIComponent(value);
}

function chunks<T>(items: readonly T[], size: number): T[][] {
  const out: T[][] = [];
  for (let start = 0; start < items.length; start += size) out.push(items.slice(start, start + size));
  return out;
}

/**
 * A client for `gieok serve`:
 *
 *     const memory = new Client();   // $GIEOK_URL and $GIEOK_API_KEY
 *     await memory.addMessages("cafe", [{ id: "m1", role: "user", text: "보리는 츄르를 좋아해", user: "u-minji" }]);
 *     const context = await memory.context("cafe", { user: "u-minji", query: "보리 간식" });
 *
 * Connection failures and 503s are retried `retries` times with exponential backoff; each write
 * carries an Idempotency-Key that stays the same across its retries (and messages carry their own
 * ids), so a retried write is stored once. Refusals are typed errors (errors.ts).
 */
export class Client {
  private readonly connection: Connection;

  constructor(options: ClientOptions = {}) {
    const fetcher = options.fetch ?? globalThis.fetch?.bind(globalThis);
    if (typeof fetcher !== "function") throw new InvalidInputError("no fetch in this runtime: pass options.fetch");
    this.connection = new Connection({
      baseUrl: options.baseUrl ?? environment("GIEOK_URL") ?? DEFAULT_URL,
      apiKey: options.apiKey ?? environment("GIEOK_API_KEY") ?? environment("GIEOK_KEY"),
      retries: options.retries ?? 3, backoffMs: options.backoffMs ?? 500, timeoutMs: options.timeoutMs ?? 300_000,
      fetch: fetcher,
    });
  }

  get baseUrl(): string {
    return this.connection.baseUrl;
  }

  private async request<T>(call: Call, read: (data: unknown) => T): Promise<T> {
    const answer = await this.connection.send(call);
    try {
      return read(jsonOf(answer, call));
    } catch (error) {
      if (!(error instanceof ShapeError)) throw error;
      throw new ServerError(`${call.method} ${call.path}: the server's answer is not what this client expects `
                            + `(${error.message})`, { status: answer.status });
    }
  }

  // -- blocks ------------------------------------------------------------------------------------
  /** Remember one block (`POST /v1/memories`); the block as stored. */
  async add(text: string, options: AddOptions = {}): Promise<Block> {
    const { signal, ...item } = options;
    const body = wireItem({ kind: "turn", importance: 0.5, ...item, text }, 1);
    return this.request({ method: "POST", path: "/v1/memories", body, write: true, signal }, readBlock);
  }

  /** Remember many blocks (texts or `MemoryItem`s), 256 a request, each request one transaction: if one fails, the requests before it stay stored. */
  async addMany(items: ReadonlyArray<string | MemoryItem>, options: CallOptions = {}): Promise<Block[]> {
    const wire = [...items].map((item, number) => wireItem(item, number + 1)); // every item checked before the first request
    const blocks: Block[] = [];
    for (const chunk of chunks(wire, MAX_BATCH)) {
      blocks.push(...await this.request({ method: "POST", path: "/v1/memories:batch", body: { items: chunk }, write: true,
                                          signal: options.signal },
                                        (data) => ((data as { blocks?: unknown[] }).blocks ?? []).map(readBlock)));
    }
    return blocks;
  }

  /** One block; `BlockNotFoundError` if the key's memory has none with this index. */
  async get(blockIndex: number, options: CallOptions = {}): Promise<Block> {
    const at = index(blockIndex);
    return this.request({ method: "GET", path: `/v1/memories/${at}`, block: at, signal: options.signal }, readBlock);
  }

  /** Erase a block's content (the chain still verifies); the indices erased, [] if it was already forgotten. */
  async forget(blockIndex: number, options: CallOptions = {}): Promise<number[]> {
    const at = index(blockIndex);
    return this.request({ method: "DELETE", path: `/v1/memories/${at}`, write: true, block: at, signal: options.signal },
                        (data) => numbersOf(data, "forgotten"));
  }

  /** Live blocks, newest first, a page at a time (`limit` ≤ 200; `cursor` from the last page). */
  async listBlocks(options: ListBlocksOptions = {}): Promise<BlockPage> {
    const params: Params = Object.entries(wireScope(options.scope) ?? {});
    for (const kind of wireKinds(options.kinds) ?? []) params.push(["kind", kind]);
    for (const [name, value] of [["since", options.since], ["until", options.until]] as const) {
      const time = wireTime(value);
      if (time !== undefined) params.push([name, String(time)]);
    }
    params.push(["limit", String(options.limit ?? 50)]);
    if (options.cursor !== undefined) params.push(["cursor", options.cursor]);
    return this.request({ method: "GET", path: "/v1/memories", params, signal: options.signal }, readBlockPage);
  }

  /** Hybrid (or `bm25`, `vector`) search; hits with their score breakdown. */
  async search(query: string, options: SearchOptions = {}): Promise<SearchResult> {
    const body = withoutEmpty({
      query, k: options.k ?? 10, scope: wireScope(options.scope), kinds: wireKinds(options.kinds),
      since: wireTime(options.since), until: wireTime(options.until), mode: options.mode ?? "hybrid",
      neighbours: options.neighbours ?? true,
    });
    return this.request({ method: "POST", path: "/v1/search", body, signal: options.signal }, readSearchResult);
  }

  // -- the memory as a whole ---------------------------------------------------------------------
  /** Counts, embedder, index, size and each layer's counters. */
  async stats(options: CallOptions = {}): Promise<ServerStats> {
    return this.request({ method: "GET", path: "/v1/stats", signal: options.signal }, readStats);
  }

  /** Walk the hash chain on the server. */
  async verify(options: CallOptions = {}): Promise<VerifyReport> {
    return this.request({ method: "GET", path: "/v1/verify", signal: options.signal }, readVerifyReport);
  }

  /** Whether the server is warm (`GET /readyz`, no key): false while it warms or when it cannot be reached. One try: a probe answers now. */
  async ready(options: CallOptions = {}): Promise<boolean> {
    try {
      const answer = await this.connection.send({ method: "GET", path: "/readyz", auth: false, accept: [503], retries: 0,
                                                  signal: options.signal });
      return answer.status === 200;
    } catch (error) {
      if (error instanceof ServerUnavailableError) return false;
      throw error;
    }
  }

  /** Wait until `ready()`; `ServerUnavailableError` naming the URL after `timeoutMs` (default 60,000). */
  async waitReady(options: WaitReadyOptions = {}): Promise<void> {
    const timeoutMs = options.timeoutMs ?? 60_000;
    const deadline = Date.now() + timeoutMs;
    while (!(await this.ready(options))) {
      if (Date.now() >= deadline) {
        throw new ServerUnavailableError(`the gieok server at ${this.baseUrl} was not ready within ${timeoutMs / 1000} s `
                                         + "(GET /readyz)");
      }
      await sleep(options.intervalMs ?? 250, options.signal);
    }
  }

  // -- conversations -----------------------------------------------------------------------------
  /** L3 facts, current ones (with `history`, superseded ones too); `asOf` those true then, `knownAt` as the server knew them then. */
  async facts(options: FactsOptions = {}): Promise<Fact[]> {
    const params: Params = [];
    if (options.user !== undefined) params.push(["user", options.user]);
    if (options.guild !== undefined) params.push(["guild", options.guild]);
    params.push(["history", options.history ? "true" : "false"], ["limit", String(options.limit ?? 200)]);
    for (const [name, value] of [["as_of", options.asOf], ["known_at", options.knownAt]] as const) {
      const time = wireTime(value);
      if (time !== undefined) params.push([name, String(time)]);
    }
    return this.request({ method: "GET", path: "/v1/facts", params, signal: options.signal },
                        (data) => ((data as { facts?: unknown[] }).facts ?? []).map(readFact));
  }

  /** State a fact about `user` (or `guild`): judged as an extracted one is (a repeat is a duplicate, a new value supersedes); this key is its source. */
  async addFact(text: string, options: AddFactOptions = {}): Promise<FactChange> {
    const body = withoutEmpty({ text, user: options.user, guild: options.guild, topic: options.topic ?? "",
                                valid_from: wireTime(options.validFrom) });
    return this.request({ method: "POST", path: "/v1/facts", body, write: true, signal: options.signal }, readFactChange);
  }

  /** Correct a wrong fact: a new version takes its place in its history. */
  async correctFact(factId: number, text: string, options: { validFrom?: When } & CallOptions = {}): Promise<FactChange> {
    const body = withoutEmpty({ text, valid_from: wireTime(options.validFrom) });
    return this.request({ method: "PATCH", path: `/v1/facts/${index(factId, "fact id")}`, body, write: true,
                          signal: options.signal }, readFactChange);
  }

  /** Erase one version of a fact; the fact blocks erased. */
  async forgetFact(factId: number, options: CallOptions = {}): Promise<number[]> {
    return this.request({ method: "DELETE", path: `/v1/facts/${index(factId, "fact id")}`, write: true,
                          signal: options.signal }, (data) => numbersOf(data, "erased"));
  }

  /** Every version of a fact's attribute, oldest first, each with its sources. */
  async factHistory(factId: number, options: CallOptions = {}): Promise<JsonObject[]> {
    return this.request({ method: "GET", path: `/v1/facts/${index(factId, "fact id")}/history`, signal: options.signal },
                        (data) => ((data as { versions?: unknown[] }).versions ?? []).map(readObject));
  }

  /** A page of the tenant's users (`users`, and `next`: the `after` of the next page, or null). */
  async users(options: { after?: string; limit?: number } & CallOptions = {}): Promise<UsersPage> {
    const params: Params = [["limit", String(options.limit ?? 100)]];
    if (options.after !== undefined) params.push(["after", options.after]);
    return this.request({ method: "GET", path: "/v1/users", params, signal: options.signal }, readUsersPage);
  }

  /** Everything the server holds about one user (an access request; an admin key). */
  async userData(user: string, options: CallOptions = {}): Promise<JsonObject> {
    return this.request({ method: "GET", path: `/v1/users/${pathPart(user, "user")}`, signal: options.signal }, readObject);
  }

  /** Erase everything of one user; the receipt counts what went (`resumed`: a request cut short before
   *  this one erased part of it, so the counts are only what was left). */
  async forgetUser(user: string, options: CallOptions = {}): Promise<JsonObject> {
    return this.request({ method: "DELETE", path: `/v1/users/${pathPart(user, "user")}`, write: true,
                          signal: options.signal }, readObject);
  }

  /** A conversation's L2 summary as the server sends it (with `markdown`). */
  async summary(channel: string, options: ConversationOptions = {}): Promise<JsonObject> {
    const params: Params = [["channel", channel]];
    if (options.guild !== undefined) params.push(["guild", options.guild]);
    return this.request({ method: "GET", path: "/v1/conversations/summary", params, signal: options.signal }, readObject);
  }

  /** Record a conversation's messages (each with its transport's `id`), 256 a request in order; the server keeps each id once, so sending a message again stores nothing. */
  async addMessages(channel: string, messages: readonly Message[], options: AddMessagesOptions = {}): Promise<MessagesResult> {
    if (options.index !== undefined && options.index !== "now" && options.index !== "behind") {
      throw new InvalidInputError(`index must be "now" or "behind", not ${JSON.stringify(options.index)}`);
    }
    if (!Array.isArray(messages)) throw new InvalidTypeError("messages must be an array of {id, role, text, user, name, time}");
    // all checked first; numbered from 0, as the server numbers them in its errors
    const wire = messages.map((message, number) => wireMessage(message, number));
    if (!wire.length) throw new InvalidInputError("addMessages needs at least one message");
    let result: MessagesResult | undefined;
    for (const chunk of chunks(wire, MAX_MESSAGES)) { // in order: each request's messages follow the last's
      // the default is not sent: a server from before `index` takes the request
      const body = withoutEmpty({ channel, guild: options.guild, messages: chunk,
                                  index: options.index === "behind" ? "behind" : undefined });
      const part = await this.request({ method: "POST", path: "/v1/conversations/messages", body, write: true,
                                        signal: options.signal }, readMessagesResult);
      result = result === undefined ? part : mergeMessagesResults(result, part);
    }
    return result as MessagesResult;
  }

  /** Delete one message sent with `addMessages` and what came from it (its turn, the facts only it stated); the receipt counts them. */
  async deleteMessage(channel: string, messageId: string, options: ConversationOptions = {}): Promise<JsonObject> {
    const params: Params = [["channel", channel]];
    if (options.guild !== undefined) params.push(["guild", options.guild]);
    return this.request({ method: "DELETE", path: `/v1/conversations/messages/${pathPart(messageId, "message id")}`,
                          params, write: true, signal: options.signal }, readObject);
  }

  /** The conversation's memory fitted to `budgetTokens`: `.text` for a system prompt, `.parts` (facts, summary, recalled, recent). */
  async context(channel: string, options: ContextOptions = {}): Promise<Context> {
    const body = withoutEmpty({ channel, guild: options.guild, user: options.user, query: options.query,
                                budget_tokens: options.budgetTokens ?? 2000,
                                include: options.include && [...options.include] });
    return this.request({ method: "POST", path: "/v1/conversations/context", body, signal: options.signal }, readContext);
  }

  // -- live events -------------------------------------------------------------------------------
  /**
   * The tenant's live events, as they happen (`for await (const event of client.events({ since: 0 }))`):
   * resumed after the last id seen when the connection drops or the server restarts.
   */
  events(options: EventsOptions = {}): AsyncGenerator<GieokEvent> {
    return streamEvents(this.connection, options);
  }
}

function numbersOf(data: unknown, field: string): number[] {
  const value = (data as Record<string, unknown> | null)?.[field];
  if (!Array.isArray(value)) throw new ShapeError(`it has no "${field}" list`);
  return value.map(Number);
}

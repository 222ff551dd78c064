/**
 * What the client sends and returns. Results keep the server's JSON field names (`block_index`,
 * `valid_from`, as docs/server.md shows them); options are camel-cased. Answers are read
 * tolerantly, as the Python client reads them (gieok/client/types.py): a field this client does not
 * know is kept, one it expects but does not get takes its default, so a newer server does not
 * break an older client. Only the fields a result cannot be without are required.
 */

/** A time: epoch seconds, an ISO 8601 string, or a Date (sent as ISO 8601). Not epoch milliseconds: the server refuses those by name. */
export type When = number | string | Date;

/** Where a block belongs; a field left out means "any" in a filter. */
export interface Scope {
  guild?: string | null;
  channel?: string | null;
  user?: string | null;
}

export type JsonObject = { [field: string]: unknown };

/** One chat message for `addMessages`. `id` is the transport's message id: the server stores each id once, which makes resending harmless. */
export interface Message {
  id: string;
  role: "user" | "assistant";
  text: string;
  /** Who wrote it (required for role "user"). */
  user?: string | null;
  /** Their display name (kept with the recent messages only). */
  name?: string | null;
  /** When it was said (default: now). */
  time?: When | null;
}

/** A parts name for `context({ include })`. */
export type ContextPart = "facts" | "summary" | "recalled" | "recent";

export interface StoredScope {
  guild: string | null;
  channel: string | null;
  user: string | null;
}

/** One long-term record as stored; a forgotten block keeps only its header and digest. */
export interface Block {
  block_index: number;
  kind: string;
  text: string;
  scope: StoredScope;
  speaker: string | null;
  event_time: number;
  insert_time: number;
  importance: number;
  keywords: string[];
  tags: string[];
  metadata: JsonObject;
  conv_pos: number | null;
  content_digest: string;
  prev_hash: string;
  hash: string;
  forgotten: boolean;
}

/** Why a hit ranked where it did; a signal that did not find the block scores 0. */
export interface ScoreBreakdown {
  bm25: number;
  bm25_rank: number | null;
  vector: number;
  vector_rank: number | null;
  fused: number;
  neighbour: number;
  recency: number;
  importance: number;
  final: number;
  learned: number | null;
  parts: Record<string, number> | null;
}

export interface Hit {
  block: Block;
  score: number;
  breakdown: ScoreBreakdown;
}

/** Hits, the layer that answered (`working_memory`, `cache`, `checkpoint`, `full`) and how long it took. */
export interface SearchResult {
  query: string;
  hits: Hit[];
  source: string;
  search_time_ms: number;
  embed_time_ms: number;
  timings_ms: Record<string, number>;
}

/** One page of `listBlocks`, newest first; pass `next_cursor` as `cursor` for the next (null: the last page). */
export interface BlockPage {
  items: Block[];
  next_cursor: string | null;
}

export interface VerifyReport {
  ok: boolean;
  checked: number;
  forgotten: number;
  first_bad_index: number | null;
  reason: string;
}

/** `GET /v1/stats`: counts, embedder, index, size and each layer's counters. */
export interface ServerStats {
  blocks: number;
  live_blocks: number;
  forgotten_blocks: number;
  by_kind: Record<string, number>;
  channels: number;
  embedder: string;
  dimension: number;
  vector_index: string;
  schema_version: number;
  file_bytes: number;
  passages: string;
  passages_configured: string;
  layers: JsonObject;
}

/** An L3 fact: current while `valid_to` is null; a superseded one names what replaced it. */
export interface Fact {
  block_index: number;
  text: string;
  fact_type: string;
  topic: string;
  keywords: string[];
  guild: string | null;
  user_id: string | null;
  source_message: string | null;
  valid_from: number;
  valid_to: number | null;
  superseded_by: number | null;
  /** When gieok learned it. */
  recorded_at: number | null;
  /** When gieok learned it was over. */
  expired_at: number | null;
  current: boolean;
}

/** What stating or correcting a fact did: `action` is stored, duplicate, superseded or history. */
export interface FactChange {
  action: string;
  fact: Fact | null;
  replaced: unknown;
  [field: string]: unknown;
}

export interface UserSummary {
  user: string;
  names: string[];
  messages: number;
  facts: number;
  conversations: number;
  first_seen: number | null;
  last_seen: number | null;
  [field: string]: unknown;
}

/** A page of the tenant's users; `next` is the `after` of the next page, or null. */
export interface UsersPage {
  users: UserSummary[];
  next: string | null;
}

/** A message the server stored: its recent (L1) row and, for a turn worth remembering, its block. */
export interface StoredMessage {
  id: string;
  role: string;
  l1_id: number | null;
  block_index: number | null;
  flagged: boolean;
}

/**
 * What `addMessages` did: the messages stored, the ids it had already (not stored again), those
 * sent again with another text (edited), the ids the guard flagged, whether summaries and facts
 * run ("on" or "off: why") and whether fact extraction started ("started", "not due", "off"), and the
 * server's time per stage (guard, embeddings, store, working memory, events) with `total_ms`.
 */
export interface MessagesResult {
  conversation: StoredScope;
  stored: StoredMessage[];
  duplicates: string[];
  edited: StoredMessage[];
  flagged: string[];
  summaries_and_facts: string;
  extraction: string;
  /** "now": each stored message's turn block was written before the answer; "behind": written just after it (block_index null). */
  index: "now" | "behind";
  timings_ms: Record<string, number>;
}

export interface ContextFact {
  text: string;
  type: string;
  user: string | null;
  guild: string | null;
  valid_from: number | string | null;
  valid_to: number | string | null;
  current: boolean;
  score: number | null;
}

/** A long-term memory recalled for the query. */
export interface RecalledTurn {
  text: string;
  speaker: string | null;
  name: string | null;
  time: number | string | null;
  score: number | null;
  block_index: number | null;
  kind: string | null;
  /** The guard flagged it when it was said. */
  flagged: boolean;
  /** A fact it stated changed since: `{text, valid_from}`. */
  superseded_by: JsonObject | null;
}

/** One of the conversation's recent messages (L1), oldest first. */
export interface RecentMessage {
  text: string;
  role: string;
  user: string | null;
  name: string | null;
  time: number | string | null;
  flagged: boolean;
}

/** The context's parts; a part not asked for (`include`) is empty. */
export interface ContextParts {
  facts: ContextFact[];
  summary: JsonObject | null;
  recalled: RecalledTurn[];
  recent: RecentMessage[];
}

/**
 * A conversation's memory fitted to a token budget. `text` is the block to put in a system
 * prompt; `parts` what it was made of; `tokens` each part's count and the total. `known` is false
 * when the server has never seen this conversation (`conversation` null, a warning says which).
 */
export interface Context {
  conversation: StoredScope | null;
  known: boolean;
  text: string;
  parts: ContextParts;
  query: string;
  language: string;
  tokens: Record<string, number>;
  budget_tokens: number;
  timings_ms: Record<string, number>;
  warnings: string[];
}

/**
 * One event of the tenant's live stream (`GET /v1/events`): its sequence number (0 for a notice
 * the stream adds, such as `stream.gap`), type (`memory.added`, `fact.added`, `search.answered` …),
 * time (epoch seconds) and data.
 */
export interface GieokEvent {
  seq: number;
  type: string;
  time: number;
  data: JsonObject;
}

// -- reading answers --------------------------------------------------------------------------

/** An answer without a field this client cannot do without (caught in client.ts: a `ServerError`). */
export class ShapeError extends Error {}

type Json = Record<string, unknown>;

function object(value: unknown, what: string): Json {
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw new ShapeError(`${what} is not an object`);
  return value as Json;
}

function need(data: Json, field: string): unknown {
  const value = data[field];
  if (value === undefined || value === null) throw new ShapeError(`it has no "${field}"`);
  return value;
}

const text = (value: unknown, fallback = ""): string => (value === undefined || value === null ? fallback : String(value));
const number = (value: unknown, fallback = 0): number => (value === undefined || value === null ? fallback : Number(value));
const maybeNumber = (value: unknown): number | null => (value === undefined || value === null ? null : Number(value));
const maybeText = (value: unknown): string | null => (value === undefined || value === null ? null : String(value));
const maybeTime = (value: unknown): number | string | null =>
  value === undefined || value === null ? null : typeof value === "number" ? value : String(value);
const texts = (value: unknown): string[] => (Array.isArray(value) ? value.map((item) => String(item)) : []);
const numbers = (value: unknown): Record<string, number> =>
  Object.fromEntries(Object.entries(value && typeof value === "object" ? value : {}).map(([k, v]) => [k, Number(v)]));
const each = <T>(value: unknown, read: (item: unknown) => T): T[] => (Array.isArray(value) ? value.map(read) : []);
const rest = (value: unknown): JsonObject => (value && typeof value === "object" && !Array.isArray(value) ? { ...value } : {});

export function readScope(value: unknown): StoredScope {
  const data = rest(value);
  return { guild: maybeText(data.guild), channel: maybeText(data.channel), user: maybeText(data.user) };
}

export function readBlock(value: unknown): Block {
  const data = object(value, "a block");
  return {
    block_index: Number(need(data, "block_index")), kind: text(need(data, "kind")), text: text(data.text),
    scope: readScope(data.scope), speaker: maybeText(data.speaker), event_time: number(data.event_time),
    insert_time: number(data.insert_time), importance: number(data.importance), keywords: texts(data.keywords),
    tags: texts(data.tags), metadata: rest(data.metadata), conv_pos: maybeNumber(data.conv_pos),
    content_digest: text(data.content_digest), prev_hash: text(data.prev_hash), hash: text(data.hash),
    forgotten: Boolean(data.forgotten),
  };
}

function readBreakdown(value: unknown): ScoreBreakdown {
  const data = rest(value);
  return {
    bm25: number(data.bm25), bm25_rank: maybeNumber(data.bm25_rank), vector: number(data.vector),
    vector_rank: maybeNumber(data.vector_rank), fused: number(data.fused), neighbour: number(data.neighbour),
    recency: number(data.recency), importance: number(data.importance), final: number(data.final),
    learned: maybeNumber(data.learned), parts: data.parts === undefined || data.parts === null ? null : numbers(data.parts),
  };
}

export function readSearchResult(value: unknown): SearchResult {
  const data = object(value, "a search result");
  return {
    query: text(need(data, "query")),
    hits: each(data.hits, (item) => {
      const hit = object(item, "a hit");
      return { block: readBlock(need(hit, "block")), score: Number(need(hit, "score")), breakdown: readBreakdown(hit.breakdown) };
    }),
    source: text(data.source, "full"), search_time_ms: number(data.search_time_ms),
    embed_time_ms: number(data.embed_time_ms), timings_ms: numbers(data.timings_ms),
  };
}

export function readBlockPage(value: unknown): BlockPage {
  const data = object(value, "a page");
  return { items: each(need(data, "items"), readBlock), next_cursor: maybeText(data.next_cursor) };
}

export function readVerifyReport(value: unknown): VerifyReport {
  const data = object(value, "a verify report");
  return {
    ok: Boolean(need(data, "ok")), checked: number(data.checked), forgotten: number(data.forgotten),
    first_bad_index: maybeNumber(data.first_bad_index), reason: text(data.reason),
  };
}

export function readStats(value: unknown): ServerStats {
  const data = object(value, "the stats");
  return {
    blocks: number(data.blocks), live_blocks: number(data.live_blocks), forgotten_blocks: number(data.forgotten_blocks),
    by_kind: numbers(data.by_kind), channels: number(data.channels), embedder: text(data.embedder),
    dimension: number(data.dimension), vector_index: text(data.vector_index), schema_version: number(data.schema_version),
    file_bytes: number(data.file_bytes), passages: text(data.passages), passages_configured: text(data.passages_configured),
    layers: rest(data.layers),
  };
}

export function readFact(value: unknown): Fact {
  const data = object(value, "a fact");
  const validTo = maybeNumber(data.valid_to);
  return {
    block_index: Number(need(data, "block_index")), text: text(data.text), fact_type: text(data.fact_type),
    topic: text(data.topic), keywords: texts(data.keywords), guild: maybeText(data.guild), user_id: maybeText(data.user_id),
    source_message: maybeText(data.source_message), valid_from: number(data.valid_from), valid_to: validTo,
    superseded_by: maybeNumber(data.superseded_by), recorded_at: maybeNumber(data.recorded_at),
    expired_at: maybeNumber(data.expired_at), current: data.current === undefined ? validTo === null : Boolean(data.current),
  };
}

export function readFactChange(value: unknown): FactChange {
  const data = object(value, "a fact change");
  return { ...data, action: text(need(data, "action")), fact: data.fact ? readFact(data.fact) : null,
           replaced: data.replaced ?? null };
}

export function readUsersPage(value: unknown): UsersPage {
  const data = object(value, "a page of users");
  return {
    users: each(need(data, "users"), (item) => {
      const user = object(item, "a user");
      return { ...user, user: text(need(user, "user")), names: texts(user.names), messages: number(user.messages),
               facts: number(user.facts), conversations: number(user.conversations),
               first_seen: maybeNumber(user.first_seen), last_seen: maybeNumber(user.last_seen) };
    }),
    next: maybeText(data.next),
  };
}

function readStored(value: unknown): StoredMessage {
  const data = object(value, "a stored message");
  return { id: text(need(data, "id")), role: text(data.role, "user"), l1_id: maybeNumber(data.l1_id),
           block_index: maybeNumber(data.block_index), flagged: Boolean(data.flagged) };
}

export function readMessagesResult(value: unknown): MessagesResult {
  const data = object(value, "a messages result");
  return {
    conversation: readScope(data.conversation), stored: each(data.stored, readStored), duplicates: texts(data.duplicates),
    edited: each(data.edited, readStored), flagged: texts(data.flagged),
    summaries_and_facts: text(data.summaries_and_facts), extraction: text(data.extraction),
    index: data.index === "behind" ? "behind" : "now", timings_ms: numbers(data.timings_ms),
  };
}

/** This result followed by a later request's (a long list is sent in several): lists concatenate, the status is the later one's, extraction counts as started if either request started it, the stages' times add up. */
export function mergeMessagesResults(first: MessagesResult, later: MessagesResult): MessagesResult {
  return {
    conversation: first.conversation, stored: [...first.stored, ...later.stored],
    duplicates: [...first.duplicates, ...later.duplicates], edited: [...first.edited, ...later.edited],
    flagged: [...first.flagged, ...later.flagged], summaries_and_facts: later.summaries_and_facts,
    extraction: first.extraction === "started" || later.extraction === "started" ? "started" : later.extraction,
    index: later.index,
    timings_ms: Object.fromEntries([...new Set([...Object.keys(first.timings_ms), ...Object.keys(later.timings_ms)])]
      .map((stage) => [stage, (first.timings_ms[stage] ?? 0) + (later.timings_ms[stage] ?? 0)])),
  };
}

export function readContext(value: unknown): Context {
  const data = object(value, "a context");
  const parts = rest(data.parts);
  const known = data.conversation !== undefined && data.conversation !== null;
  return {
    conversation: known ? readScope(data.conversation) : null, known, text: text(need(data, "text")),
    parts: {
      facts: each(parts.facts, (item) => {
        const fact = rest(item);
        return { text: text(fact.text), type: text(fact.type), user: maybeText(fact.user), guild: maybeText(fact.guild),
                 valid_from: maybeTime(fact.valid_from), valid_to: maybeTime(fact.valid_to),
                 current: fact.current === undefined ? true : Boolean(fact.current), score: maybeNumber(fact.score) };
      }),
      summary: parts.summary ? rest(parts.summary) : null,
      recalled: each(parts.recalled, (item) => {
        const turn = rest(item);
        return { text: text(turn.text), speaker: maybeText(turn.speaker), name: maybeText(turn.name),
                 time: maybeTime(turn.time), score: maybeNumber(turn.score), block_index: maybeNumber(turn.block_index),
                 kind: maybeText(turn.kind), flagged: Boolean(turn.flagged),
                 superseded_by: turn.superseded_by ? rest(turn.superseded_by) : null };
      }),
      recent: each(parts.recent, (item) => {
        const line = rest(item);
        return { text: text(line.text), role: text(line.role, "user"), user: maybeText(line.user), name: maybeText(line.name),
                 time: maybeTime(line.time), flagged: Boolean(line.flagged) };
      }),
    },
    query: text(data.query), language: text(data.language), tokens: numbers(data.tokens),
    budget_tokens: number(data.budget_tokens), timings_ms: numbers(data.timings_ms), warnings: texts(data.warnings),
  };
}

export function readObject(value: unknown): JsonObject {
  return { ...object(value, "the answer") };
}

export function readEvent(value: unknown): GieokEvent {
  const data = object(value, "an event");
  return { seq: number(data.seq), type: text(need(data, "type")), time: number(data.time), data: rest(data.data) };
}

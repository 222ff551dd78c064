/**
 * gieok for TypeScript and JavaScript: a client for `gieok serve` (conversation memory for agents —
 * recent messages, summaries, facts with their validity, recall), fetch-based, with no dependencies.
 *
 *     import { Client } from "gieok";
 *     const memory = new Client();   // $GIEOK_URL (default http://127.0.0.1:8420), $GIEOK_API_KEY
 *
 * The Vercel AI SDK middleware is `gieok/ai-sdk`.
 */

export { Client, MAX_BATCH, MAX_MESSAGES } from "./client.js";
export type {
  AddFactOptions, AddMessagesOptions, AddOptions, CallOptions, ClientOptions, ContextOptions, ConversationOptions, FactsOptions,
  ListBlocksOptions, MemoryItem, SearchOptions, WaitReadyOptions,
} from "./client.js";
export type { EventsOptions } from "./events.js";
export {
  AuthenticationError, BlockNotFoundError, EmbedderError, GieokError, InvalidInputError, InvalidTypeError, LLMError,
  NotFoundError, PermissionDeniedError, ServerError, ServerUnavailableError, StorageFullError, StoreError,
} from "./errors.js";
export type { ErrorEnvelope } from "./errors.js";
export { DEFAULT_URL, IDEMPOTENCY_HEADER } from "./http.js";
export type { FetchLike } from "./http.js";
export type {
  Block, BlockPage, Context, ContextFact, ContextPart, ContextParts, Fact, FactChange, GieokEvent, Hit, JsonObject,
  Message, MessagesResult, RecalledTurn, RecentMessage, Scope, ScoreBreakdown, SearchResult, ServerStats,
  StoredMessage, StoredScope, UserSummary, UsersPage, VerifyReport, When,
} from "./types.js";
export { VERSION } from "./version.js";

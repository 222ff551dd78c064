/**
 * One error hierarchy, named as the Python package's (`gieok.errors`), so code catches the same
 * classes in both languages: `catch (e) { if (e instanceof NotFoundError) … }`. Every error the
 * client throws on purpose is a `GieokError`; `status` is the HTTP status when one came, `type`
 * the server's error type (`invalid_input`, `not_found`, `since_ahead` …; "" when none) and
 * `envelope` the server's whole `error` object (with fields such as `details` or `latest`).
 */

/** What the server's `{"error": {…}}` answer said, kept on the error. */
export interface ErrorEnvelope {
  type?: string;
  message?: string;
  [field: string]: unknown;
}

export interface ErrorInit {
  status?: number;
  type?: string;
  envelope?: ErrorEnvelope;
  cause?: unknown;
}

/** Base of every error gieok throws on purpose. */
export class GieokError extends Error {
  /** The HTTP status of the answer, undefined when none came (a refused connection, a check made before sending). */
  readonly status: number | undefined;
  /** The server's error type from the envelope, "" when there was none. */
  readonly type: string;
  readonly envelope: ErrorEnvelope | undefined;

  constructor(message: string, init: ErrorInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.status = init.status;
    this.type = init.type ?? "";
    this.envelope = init.envelope;
  }
}

/** A value was refused before anything was written (HTTP 400, 422, 413; or refused by this client before sending). */
export class InvalidInputError extends GieokError {}

/** A value had the wrong type (checked by this client before sending). */
export class InvalidTypeError extends GieokError {}

/** What was asked for does not exist, or is not the caller's to see (HTTP 404). */
export class NotFoundError extends GieokError {}

/** No block has the requested index (a 404 about a block). */
export class BlockNotFoundError extends NotFoundError {}

/** The server's storage failed or is away for a moment (a 503 `store_unavailable`, after the retries). */
export class StoreError extends GieokError {}

/** The server's embedding engine failed or is away for a moment (a 503 `embedder_unavailable`, after the retries). */
export class EmbedderError extends GieokError {}

/**
 * The disk under the server's memory is full (HTTP 507 `storage_full`): nothing of the write was
 * stored, what was stored before is intact and readable, and writes work again once space is freed
 * (not retried: waiting does not free space).
 */
export class StorageFullError extends StoreError {}

/** A language-model call the server made failed (HTTP 502). */
export class LLMError extends GieokError {}

/** No API key, or one that is malformed, unknown or revoked (HTTP 401). */
export class AuthenticationError extends GieokError {}

/** The key is valid but its role may not do this (HTTP 403). */
export class PermissionDeniedError extends GieokError {}

/**
 * The server failed in a way no closer class names: a 5xx, a conflict (409), an answer this client
 * cannot read. `status` is the HTTP status, undefined when no answer came.
 */
export class ServerError extends GieokError {}

/** The server could not be reached (refused, reset, timed out), or answered 503 to every retry; the message names the URL. */
export class ServerUnavailableError extends ServerError {}

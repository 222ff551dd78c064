/**
 * The tenant's live event stream (`GET /v1/events`, Server-Sent Events) as an async iterator that
 * resumes where it was: each reconnect asks for `since=<the last id seen>`, so a dropped
 * connection, a server restart (`stream.closed`, reason "stopping") or a stream cut for lagging
 * (`stream.lagged`) loses nothing the server's buffer still holds; what it no longer holds comes as
 * a `stream.gap` event. A revoked key ends the loop with `AuthenticationError`.
 */

import { AuthenticationError, GieokError, InvalidInputError, InvalidTypeError, ServerError,
         ServerUnavailableError } from "./errors.js";
import { anySignal, type Connection, networkFailure, sleep } from "./http.js";
import { type GieokEvent, readEvent, ShapeError } from "./types.js";

export interface EventsOptions {
  /** Resume after this sequence number (0: everything the server's buffer holds, then live); default: from now on. */
  since?: number;
  /** Only these event types (`"memory.added"`, or a family: `"fact.*"`); `stream.gap` comes whatever they are. */
  kinds?: readonly string[];
  /** Ends the stream; the loop then throws the signal's reason. `break` out of the loop ends it quietly. */
  signal?: AbortSignal;
}

interface Frame {
  event: string;
  data: string;
}

/** The frames of one SSE body: comments (`: ping`) skipped, `data:` lines joined. */
async function* framesOf(body: ReadableStream<Uint8Array>): AsyncGenerator<Frame> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "";
  let data: string[] = [];
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, newline).replace(/\r$/, "");
        buffer = buffer.slice(newline + 1);
        if (line === "") {
          if (data.length) yield { event: event || "message", data: data.join("\n") };
          event = "";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = value;
        else if (field === "data") data.push(value);
      }
    }
  } finally {
    reader.cancel().catch(() => undefined);
  }
}

function matcher(kinds: readonly string[] | undefined): (type: string) => boolean {
  if (kinds === undefined) return () => true;
  if (!Array.isArray(kinds) || kinds.some((kind) => typeof kind !== "string")) {
    throw new InvalidTypeError("kinds must be an array of event types (\"memory.added\", \"fact.*\")");
  }
  const exact = new Set(kinds.filter((kind) => !kind.endsWith(".*")));
  const families = kinds.filter((kind) => kind.endsWith(".*")).map((kind) => kind.slice(0, -1));
  return (type) => exact.has(type) || families.some((family) => type.startsWith(family));
}

export async function* streamEvents(connection: Connection, options: EventsOptions = {}): AsyncGenerator<GieokEvent> {
  const { since, signal } = options;
  if (since !== undefined && (!Number.isInteger(since) || since < 0)) {
    throw new InvalidInputError(`since must be an event id, a whole number 0 or more, not ${String(since)}`);
  }
  const wanted = matcher(options.kinds);
  let after = since;
  let failures = 0; // connections in a row that ended without an event
  for (;;) {
    const mine = new AbortController(); // ends this connection when the loop stops, whichever way
    const params: Array<[string, string]> = after === undefined ? [] : [["since", String(after)]];
    let reason = "the stream ended";
    try {
      const response = await connection.open({ method: "GET", path: "/v1/events", params,
                                               signal: signal ? anySignal([signal, mine.signal]) : mine.signal });
      if (!response.body) throw new ServerError("GET /v1/events: the server answered without a body");
      for await (const frame of framesOf(response.body)) {
        let payload: unknown;
        try {
          payload = JSON.parse(frame.data);
        } catch {
          throw new ServerError(`GET /v1/events: an event that is not JSON: ${frame.data.slice(0, 200)}`);
        }
        const fields = (payload ?? {}) as { type?: unknown; reason?: unknown; message?: unknown };
        if (frame.event === "stream.closed" || fields.type === "stream.closed") {
          if (fields.reason === "revoked") {
            throw new AuthenticationError(String(fields.message ?? "this stream's API key was revoked"), { type: "revoked" });
          }
          reason = `the server closed it (${String(fields.reason ?? "no reason")})`; // "stopping": come back after it
          break;
        }
        let event: GieokEvent;
        try {
          event = readEvent(payload);
        } catch (error) {
          if (error instanceof ShapeError) throw new ServerError(`GET /v1/events: an event without a type: ${frame.data.slice(0, 200)}`);
          throw error;
        }
        failures = 0;
        if (event.seq > 0) after = event.seq;
        if (event.type === "stream.lagged") continue; // the server cuts a lagging stream: resume from `after`
        if (event.type === "stream.gap" || wanted(event.type)) yield event;
      }
    } catch (error) {
      if (signal?.aborted) throw signal.reason ?? error;
      if (error instanceof GieokError || !networkFailure(error)) throw error;
      reason = `it was cut (${error instanceof Error ? error.message : String(error)})`;
    } finally {
      mine.abort();
    }
    failures += 1;
    if (failures > connection.retries) {
      throw new ServerUnavailableError(`the event stream of the gieok server at ${connection.baseUrl} ended `
                                       + `${failures} times in a row without an event; last: ${reason}`);
    }
    await sleep(connection.delay(failures, undefined), signal);
  }
}

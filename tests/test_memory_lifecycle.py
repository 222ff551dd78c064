"""A closed Memory is freed by reference counting alone, on every backend.

Its parts call back into it (promotion writes a note, a foreign change drops the answer cache, a
write asks whether it is open). Held as bound methods or lambdas these made reference cycles, which
CPython frees only when its cycle collector next runs a full pass: a server that opens and closes
tenants in turn kept every closed one — its catalog, vectors and postings — until then (a worker
going round 1,000 small PostgreSQL tenants grew by ~40 MB). `gieok/callbacks.py` holds them weakly.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gieok import Memory
from gieok.callbacks import weakly
from gieok.errors import InvalidInputError
from gieok.server.settings import ServerSettings
from gieok.server.tenants import TenantRegistry
from store_backends import Backend


@contextmanager
def _no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _used(memory: Memory) -> None:
    """Every part that calls back: a write, a search through the layers, working memory and STM."""
    memory.add("누리는 고양이를 좋아해. Nuri likes cats.", scope={"channel": "c1"}, kind="turn")
    memory.search("고양이 cats", 3, scope={"channel": "c1"})
    memory.remember("a working-memory line about cats", scope={"channel": "c1"})


def test_a_closed_memory_is_freed_without_the_cycle_collector(backend: Backend) -> None:
    memory = Memory(backend.location)
    _used(memory)
    parts = [weakref.ref(memory), weakref.ref(memory.indexes), weakref.ref(memory.layers),
             weakref.ref(memory.store), weakref.ref(memory.working)]
    with _no_cycle_collector():
        memory.close()
        del memory
        alive = [ref() for ref in parts if ref() is not None]
        assert not alive, f"kept alive by a reference cycle after close: {[type(o).__name__ for o in alive]}"


def test_a_tenant_the_registry_closes_is_freed_at_once(tmp_path) -> None:
    """The server's registry closes the least recently used tenant beyond `max_open`: it is gone
    then, not when the collector next runs."""
    settings = ServerSettings().with_overrides(timezone="UTC")
    registry = TenantRegistry(tmp_path / "home.db", settings, max_open=1)
    try:
        first = registry.acquire("first")
        first.memory.add("a block of the first tenant")
        ref = weakref.ref(first.memory)
        registry.release(first)
        del first
        with _no_cycle_collector():
            second = registry.acquire("second")  # evicts and closes "first"
            registry.release(second)
            assert registry.open_names() == ["second"]
            assert ref() is None
    finally:
        registry.close()


def test_a_weak_callback_calls_its_method_and_says_when_its_object_is_gone() -> None:
    class Owner:
        def twice(self, x: int) -> int:
            return 2 * x

    owner = Owner()
    call = weakly(owner.twice)
    assert call(21) == 42
    with _no_cycle_collector():
        del owner
        with pytest.raises(InvalidInputError, match="closed"):
            call(1)


def test_a_closed_memory_says_so_and_keeps_its_data(tmp_path) -> None:
    path = tmp_path / "m.db"
    memory = Memory(path)
    block = memory.add("kept across the close")
    memory.close()
    with pytest.raises(InvalidInputError, match="closed"):
        memory.add("after close")
    with Memory(path) as again:
        assert again.get(block.block_index).text == "kept across the close"
        found = again.search("kept", 1, layers=False)
        assert [hit.block.block_index for hit in found.hits] == [block.block_index]

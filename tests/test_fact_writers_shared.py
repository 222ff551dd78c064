"""Facts written by two processes of one database at once (`gieok serve --workers 2`, bot
processes): each write reads the subject's versions, decides, then writes. Two writers that both
read before either wrote each superseded the same version — two current values of one attribute
("lives in Seoul" and "lives in Daegu"). A write now stores nothing if the subject changed since
its read, and is decided again. Real SQLite file, the real packaged embedder, two `Memory`s."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from gieok import Memory
from gieok.chat.conversation.facts import FactOutcome, FactStore, Statement
from gieok.store.conversation import FactsMovedError

T0 = 1_780_000_000.0


@pytest.fixture
def two(tmp_path: Path):
    path = tmp_path / "shared.db"
    first, second = Memory(path), Memory(path)
    try:
        yield FactStore(first, first.store.conversation), FactStore(second, second.store.conversation)
    finally:
        first.close()
        second.close()


def both_read_then_write(stores: tuple[FactStore, FactStore]) -> threading.Barrier:
    """Each store's first write waits until the other has read too: the interleaving two processes
    meet when their extractions of one user finish together."""
    barrier = threading.Barrier(2)
    for store in stores:
        real, first_write = store._write, [True]

        def write(*args: Any, _real: Any = real, _first: list[bool] = first_write, **kwargs: Any) -> FactOutcome:
            if _first[0]:  # its first try only: a try again reads after the other's write
                _first[0] = False
                barrier.wait(timeout=10)
            return _real(*args, **kwargs)

        store._write = write  # type: ignore[method-assign]
    return barrier


def add(store: FactStore, text: str, at: float) -> FactOutcome:
    return store.add(text, fact_type="user_fact", topic="거주지", guild="g", user_id="42", statement=Statement(at))


def test_two_processes_superseding_one_fact_at_once_leave_one_chain(two: tuple[FactStore, FactStore]) -> None:
    first, second = two
    add(first, "<user:42>는 부산에 산다.", T0)
    barrier = both_read_then_write(two)
    done: dict[str, FactOutcome] = {}
    threads = [threading.Thread(target=lambda: done.update(a=add(first, "<user:42>는 서울에 산다.", T0 + 100))),
               threading.Thread(target=lambda: done.update(b=add(second, "<user:42>는 대구에 산다.", T0 + 200)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not barrier.broken, "both read before either wrote"
    # whichever wrote second decided again: Seoul, said before Daegu, then went into the history
    assert done["b"].action == "superseded" and done["a"].action in ("superseded", "history")
    for store in two:
        assert [f.text for f in store.facts(user_id="42")] == ["<user:42>는 대구에 산다."]
        history = sorted(store.facts(user_id="42", include_history=True), key=lambda f: f.valid_from)
        assert [(f.text, f.valid_from - T0, None if f.valid_to is None else f.valid_to - T0) for f in history] == [
            ("<user:42>는 부산에 산다.", 0, 100), ("<user:42>는 서울에 산다.", 100, 200),
            ("<user:42>는 대구에 산다.", 200, None)]


def test_a_write_that_keeps_meeting_others_says_so(two: tuple[FactStore, FactStore],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every try found the subject changed (a pathological stream of other writers): the write
    raises FactsMovedError after its tries, and stored nothing."""
    first, _ = two
    add(first, "<user:42>는 부산에 산다.", T0)
    seen = iter(range(1000))
    monkeypatch.setattr(first.tables, "fact_subject_state", lambda subject: (next(seen),))
    with pytest.raises(FactsMovedError):
        add(first, "<user:42>는 서울에 산다.", T0 + 100)
    assert [f.text for f in first.facts(user_id="42", include_history=True)] == ["<user:42>는 부산에 산다."]
    assert first.memory.stats().blocks == 1, "no fact block was appended by the refused tries"

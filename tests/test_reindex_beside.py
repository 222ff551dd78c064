"""`gieok reindex` while the memory is open elsewhere (a server, a bot, another worker), and the
working memory's copies of the vectors it replaces: nothing is damaged, nothing crashes, and what is
open learns it must open the memory again — a server does so by itself."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from gieok import Memory
from gieok.errors import MemoryReembeddedError
from gieok.memory import reindex
from gieok.server import ServerState, create_app, tenant_path
from gieok.server.settings import ServerSettings

TURNS = ["민지: 우리 집 고양이 이름은 나비야", "지훈: 나비 귀엽다 몇 살이야?", "민지: 세 살이야, 츄르를 제일 좋아해",
         "Alex: my dog Max loves the beach", "Emily: Max should meet Nabi someday"]


def remembered(path: Path) -> list[int]:
    with Memory(path) as memory:
        return [memory.remember(text, scope={"channel": "cafe"}, event_time=1_700_000_000 + 60 * i).block_index
                for i, text in enumerate(TURNS)]


def test_a_memory_open_beside_a_reindex_refuses_to_read_or_write_and_the_file_stays_whole(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    remembered(path)
    beside = Memory(path)
    assert beside.search("고양이 이름", 2).hits
    reindex(path, "use")  # another process: the embedder changes (384-d e5 → 512-d USE)
    with pytest.raises(MemoryReembeddedError, match="open the memory again"):
        beside.search("고양이 이름", 2)
    with pytest.raises(MemoryReembeddedError):
        beside.add("지훈: 이건 저장되면 안 돼", scope={"channel": "cafe"})
    with pytest.raises(MemoryReembeddedError):  # and again: it does not wear off
        beside.search("고양이 이름", 2)
    beside.close()
    with Memory(path) as memory:  # the file opens, whole, on the new model
        assert memory.stats().dimension == 512 and memory.verify().ok
        assert memory.stats().blocks == len(TURNS)
        assert "나비" in memory.search("고양이 이름이 뭐야", 1).hits[0].block.text


def test_a_write_that_slips_between_its_check_and_a_reindex_is_refused_inside_its_transaction(tmp_path: Path) -> None:
    """The store checks the vectors' dimension against the file's inside the write's own
    transaction: a process that read the record just before a reindex committed still cannot
    store vectors the file could not be opened with."""
    path = tmp_path / "m.db"
    remembered(path)
    with Memory(path) as memory:
        vector = memory.embedder.embed_passages(["지훈: 늦은 쓰기"])
        new = memory._writes.prepare("지훈: 늦은 쓰기", scope={"channel": "cafe"})
    reindex(path, "use")
    with Memory(path) as memory:
        with pytest.raises(MemoryReembeddedError, match="nothing was written"):
            memory.store.append([new], vector, 1_700_000_999.0)
        assert memory.stats().blocks == len(TURNS)
    with Memory(path) as memory:
        assert memory.verify().ok


def test_working_memory_slots_take_their_blocks_new_vectors(tmp_path: Path) -> None:
    """A slot keeps a copy of its block's vector: a reindex and a neighbour embedded again without
    an erased turn give the slots the new ones (in the store, and in the memory that did it), and a
    slot still holding another model's copy is matched by its words, not a crash."""
    path = tmp_path / "m.db"
    blocks = remembered(path)
    reindex(path, "use")
    with Memory(path) as memory:
        slots = {s.block_index: s for s in memory.working.all_slots()}
        assert slots and all(s.embedding is not None and s.embedding.shape == (512,) for s in slots.values())
        for index, slot in slots.items():
            np.testing.assert_allclose(slot.embedding, memory.vectors_of([index])[0], rtol=1e-6)
        assert memory.search("고양이 이름", 3, scope={"channel": "cafe"}).hits  # layers on: slots compared

        held = max(slots)  # a slot's block whose turn before it is erased: embedded again
        _, redone = memory.forget_with_neighbours([held - 1])
        assert redone == [held]
        in_memory = next(s for s in memory.working.all_slots() if s.block_index == held)
        np.testing.assert_allclose(in_memory.embedding, memory.vectors_of([held])[0], rtol=1e-6)
    conn = sqlite3.connect(path)
    try:
        blob = conn.execute("SELECT embedding FROM wm_slots WHERE block_index = ?", (held,)).fetchone()[0]
        conn.execute("UPDATE wm_slots SET embedding = ? WHERE block_index = ?",  # one left from another model
                     (np.ones(384, dtype="<f4").tobytes(), blocks[-1]))
        conn.commit()
    finally:
        conn.close()
    with Memory(path) as memory:
        np.testing.assert_allclose(np.frombuffer(blob, dtype="<f4"), memory.vectors_of([held])[0], rtol=1e-6)
        assert memory.search("Max the dog", 3, scope={"channel": "cafe"}).hits


def test_a_server_opens_a_tenant_again_after_a_reindex_beside_it(tmp_path: Path) -> None:
    home = tmp_path / "home.db"
    state = ServerState.open(ServerSettings.load(db=str(home)))
    key, _ = state.keys.create("acme", "write", "agent")
    headers = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(state)) as client:
        assert state.readiness.done.wait(120)
        for text in TURNS:
            assert client.post("/v1/memories", json={"text": text, "scope": {"channel": "cafe"}},
                               headers=headers).status_code == 201
        assert client.post("/v1/search", json={"query": "고양이 이름", "k": 2}, headers=headers).status_code == 200
        reindex(tenant_path(home, "acme"), "use")  # an operator, beside the running server
        refused = client.post("/v1/search", json={"query": "고양이 이름", "k": 2}, headers=headers)
        assert refused.status_code == 503 and "open the memory again" in refused.json()["error"]["message"]
        again = client.post("/v1/search", json={"query": "고양이 이름이 뭐야", "k": 2}, headers=headers)
        assert again.status_code == 200 and "나비" in again.json()["hits"][0]["block"]["text"]
        assert client.post("/v1/memories", json={"text": "지훈: 다시 열렸다", "scope": {"channel": "cafe"}},
                           headers=headers).status_code == 201
        health = client.get("/v1/stats", headers=headers).json()
        assert health["dimension"] == 512 and health["blocks"] == len(TURNS) + 1

"""Where the time of adding messages goes: `POST /v1/conversations/messages` answers `timings_ms`
per stage (docs/agents.md), through `gieok serve`'s app on a real port
and the Python client."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gieok.client import Client, Message
from live_server import InProcessServer, create_key

# Every message through these, in this order (the guard's classifier stages when it has one).
STAGES = ("check_ms", "guard_patterns_ms", "lock_wait_ms", "l1_ms", "passage_texts_ms", "passage_embed_ms",
          "commit_wait_ms", "turn_blocks_ms", "links_ms", "extraction_ms", "events_ms")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessServer, str]]:
    db: Path = tmp_path_factory.mktemp("message-timings") / "chat.db"
    key = create_key(db, "default", "write")
    server = InProcessServer(db)
    try:
        yield server, key
    finally:
        server.stop()


def _check(timings: dict[str, float]) -> None:
    missing = [stage for stage in (*STAGES, "total_ms") if stage not in timings]
    assert not missing, (missing, timings)
    assert all(value >= 0 for value in timings.values()), timings
    stages = sum(value for stage, value in timings.items() if stage != "total_ms")
    assert stages <= timings["total_ms"] + 0.01 * len(timings), timings  # each rounded to a microsecond


@pytest.mark.parametrize("text", ["다음 주 화요일에 부산으로 이사 가요", "I'm moving to Busan next Tuesday"])
def test_one_message_answers_its_stages(served: tuple[InProcessServer, str], text: str) -> None:
    server, key = served
    channel = f"c-{uuid.uuid4().hex[:8]}"
    body = {"channel": channel, "guild": "g1",
            "messages": [{"id": f"m-{uuid.uuid4().hex}", "role": "user", "user": "u1", "name": "Mina", "text": text}]}
    response = httpx.post(f"{server.url}/v1/conversations/messages", json=body,
                          headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert response.status_code == 202, response.text
    answer = response.json()
    assert len(answer["stored"]) == 1 and answer["stored"][0]["block_index"] is not None
    for field in ("conversation", "duplicates", "edited", "flagged", "summaries_and_facts", "extraction"):
        assert field in answer  # the answer's fields stay
    _check(answer["timings_ms"])
    assert answer["timings_ms"]["passage_embed_ms"] > 0  # a new message's passage is embedded


def test_the_client_reads_the_timings(served: tuple[InProcessServer, str]) -> None:
    server, key = served
    channel = f"c-{uuid.uuid4().hex[:8]}"
    with Client(server.url, api_key=key) as client:
        result = client.add_messages(channel, [
            Message(f"m-{uuid.uuid4().hex}", "user", "내일 서울에서 만나요", user="u1"),
            Message(f"m-{uuid.uuid4().hex}", "assistant", "Sure, see you in Seoul tomorrow!")], guild="g1")
        assert result.stored_count == 2
        _check(result.timings_ms)
        again = client.add_messages(channel, [Message(result.stored[0].id, "user", "내일 서울에서 만나요",
                                                      user="u1")], guild="g1")
        assert again.duplicates and "total_ms" in again.timings_ms  # a duplicate: nothing embedded, still timed

"""`gieok bot --serve`: the bot and the server in one process. The bot's turns, memory writes and
health show up live on the server (the bot's memory is the default tenant); the transport here is
the runtime's own test outbox, not Discord (the Discord adapter has tests of its own)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx

from cli_runner import gieok
from gieok import Memory
from gieok.chat.compose import build_bot
from gieok.chat.runtime.core import ChannelRef, InboundMessage
from gieok.server import ServerState, create_app
from gieok.server.beside import attach_bot, serve_beside
from gieok.server.settings import ServerSettings
from runtime_helpers import ChatModel, RecordingOutbox, until

CAFE = ChannelRef("cafe", "g1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_bots_turns_and_health_are_visible_live(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    memory = Memory(settings=ServerSettings(db=str(db), debounce_seconds=0.05, debounce_finished_seconds=0.05,
                                            rate_limit_channel_seconds=0.0, rate_limit_global_seconds=0.0,
                                            analysis_every=1))
    model, outbox = ChatModel(), RecordingOutbox()
    bot = build_bot(None, memory, outbox=outbox, llm=model, bot_user_id="999")
    core = bot.core
    state = ServerState.open(ServerSettings.over(memory.settings))
    key, _ = state.keys.create("default", "read")
    other_key, _ = state.keys.create("elsewhere", "read")
    attach_bot(state, bot)
    port = _free_port()
    stop = asyncio.Event()
    seen: dict[str, object] = {}

    async def bot_and_client() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            await until(lambda: seen.get("started") is True)
            core.set_active(CAFE, True)
            async with client.stream("GET", "/v1/events", headers=headers) as stream:
                await core.submit(InboundMessage(CAFE, "1", "누리야 내 고양이 이름은 나비야", display_name="민지",
                                                 message_id="m1"))
                types = []
                async for line in stream.aiter_lines():
                    if line.startswith("event: "):
                        types.append(line[len("event: "):])
                    if {"turn.timings", "memory.added"} <= set(types):  # the turn, then its blocks written behind
                        break
            seen["types"] = types
            seen["health"] = (await client.get("/v1/health", headers=headers)).json()
            elsewhere = await client.get("/v1/health", headers={"Authorization": f"Bearer {other_key}"})
            seen["elsewhere"] = elsewhere.json()
            messages = await client.get("/v1/conversations/messages", params={"channel": "cafe", "guild": "g1"},
                                        headers=headers)
            seen["messages"] = messages.json()["messages"]
        stop.set()

    async def main() -> None:
        def started(_server: object) -> None:
            seen["started"] = True

        async def stop_bot() -> None:
            await core.close()

        async def run_until_stopped() -> None:
            client = asyncio.create_task(bot_and_client())
            await stop.wait()
            await client

        await serve_beside(create_app(state), run_until_stopped(), stop_bot, host="127.0.0.1", port=port,
                           on_started=started)

    try:
        asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        memory.close()
    assert outbox.sent and "나비" in outbox.sent[0].text
    assert "turn.timings" in seen["types"] and "memory.added" in seen["types"]  # type: ignore[operator]
    bot = seen["health"]["bot"]  # type: ignore[index]
    assert bot["health"]["messages_in"] == 1 and bot["health"]["replies_out"] == 1
    assert seen["elsewhere"]["bot"] is None  # type: ignore[index]  # another tenant does not see the bot
    assert [m["role"] for m in seen["messages"]] == ["user", "assistant"]  # type: ignore[union-attr]


def test_bot_serve_checks_its_configuration_first(tmp_path: Path) -> None:
    done = gieok("bot", "--serve", "--db", str(tmp_path / "b.db"), env={"DISCORD_TOKEN": None, "HOME": str(tmp_path)})
    assert done.returncode == 1 and "no Discord token" in done.stderr
    assert not (tmp_path / "b.db").exists()

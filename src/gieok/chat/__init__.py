"""The chat ring: the conversation memory and the bot built on the engine.

- `conversation/`: L1 recent messages, L2 rolling summaries, L3 facts (`ConversationMemory`) — the
  engine's `layers/` (working memory, STM, checkpoints, cache) are another thing;
- `agent/`: the conversation pipeline (guard, gatekeeper, recall, context assembly);
- `llm/`: the models behind one protocol (key rotation, fallback, streaming, tools);
- `runtime/`: the bot core (debounce, batching, calls, rate limits, replies);
- `adapters/`: Discord and the terminal chat;
- `compose.py`: the one place the bot is put together (`build_pipeline`, `build_bot`);
- `settings.py`: the chat's settings (`ChatSettings`, on top of the engine's).

Nothing here is imported by the engine (`gieok`), and nothing here imports the server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compose import Bot, build_bot, build_pipeline
    from .conversation.memory import ConversationMemory
    from .settings import ChatSettings

__all__ = ["Bot", "build_bot", "build_pipeline", "ChatSettings", "ConversationMemory"]

# Loaded when first asked for (PEP 562): importing one module of the ring — `gieok.chat.settings`,
# which every `gieok` command reads through the server's settings — must not load the whole bot
# (the pipeline, its classifiers' code, the model clients: ~0.25 s of every command's start).
_HOMES = {"Bot": ".compose", "build_bot": ".compose", "build_pipeline": ".compose",
          "ConversationMemory": ".conversation.memory", "ChatSettings": ".settings"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value

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

from typing import TYPE_CHECKING

from .lazy_members import lazy_members

if TYPE_CHECKING:
    from .compose import Bot, build_bot, build_pipeline
    from .conversation.memory import ConversationMemory
    from .settings import ChatSettings

__all__ = ["Bot", "build_bot", "build_pipeline", "ChatSettings", "ConversationMemory"]

# Loaded when first asked for: chat/lazy_members.py says why.
_HOMES = {"Bot": ".compose", "build_bot": ".compose", "build_pipeline": ".compose",
          "ConversationMemory": ".conversation.memory", "ChatSettings": ".settings"}

__getattr__ = lazy_members(__name__, _HOMES)

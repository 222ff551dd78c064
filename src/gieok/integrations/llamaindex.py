"""gieok inside LlamaIndex, as a memory block: `llama_index.core.memory.Memory` keeps the recent
chat (its short-term memory) and asks each block for what to add to the prompt.

    memory = Memory.from_defaults(session_id="minji-chat", token_limit=4000, tokenizer_fn=approximate_tokens,
                                  memory_blocks=[GieokMemoryBlock(client=gieok, user="u-minji", user_name="민지")])

**The Memory's session id is the conversation's channel** (or the block's own `channel`).
`aget` (each `Memory.aget`) returns gieok's context of that conversation for the latest user
message — the user's facts, the summary, older turns recalled for it, the most recent of what gieok
holds — which `Memory` puts into the system message. `aput` is given the messages the Memory
flushes out of its short-term memory (when the chat outgrows `token_limit` ×
`chat_history_token_ratio`), and records the users' and assistants' messages among them as gieok
messages: what gieok learns facts and summaries from. A system, tool or function message is not a
conversation message and is not recorded; a message without text (only an image) neither.

`approximate_tokens` counts tokens without files: `Memory`'s default tokenizer is tiktoken's,
which downloads its vocabulary on first use — on a machine without internet that would fail (or
hang) at the first `aput`. The block imports LlamaIndex and `gieok.client`, nothing else of gieok's
rings (docs/integrations/llamaindex.md).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from ..client import AsyncClient, Message
from ..errors import InvalidInputError

try:
    from llama_index.core.base.llms.types import ChatMessage, MessageRole
    from llama_index.core.bridge.pydantic import Field
    from llama_index.core.memory import BaseMemoryBlock
except ImportError as exc:  # the extra is not installed
    raise ImportError('gieok.integrations.llamaindex needs LlamaIndex: pip install "gieok[llamaindex]"'
                      f" ({exc.name or 'llama_index'} is not installed)", name=exc.name) from exc

__all__ = ["GieokMemoryBlock", "approximate_tokens"]

_ROLES: dict[MessageRole, Literal["user", "assistant"]] = {
    MessageRole.USER: "user", MessageRole.ASSISTANT: "assistant", MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
}
# A Hangul syllable or a CJK character, a run of other letters, a digit, a punctuation mark: close
# to what BPE vocabularies make of Korean and English (a little over for English words).
_TOKEN = re.compile(r"[\uac00-\ud7a3\u3040-\u30ff\u4e00-\u9fff]|[^\W\d_]+|\d|[^\w\s]")


def approximate_tokens(text: str) -> list[str]:
    """`Memory(tokenizer_fn=…)` that needs no vocabulary file: the pieces of `text` a token count
    is estimated from (each Hangul syllable, each word, each digit and punctuation mark)."""
    return _TOKEN.findall(text)


class GieokMemoryBlock(BaseMemoryBlock[str]):
    """A LlamaIndex memory block backed by `gieok serve`: context in (`aget`), messages out (`aput`).

    `client` is a `gieok.client.AsyncClient` (its key decides the memory); `user` is whose messages
    the users' messages are (their facts come into the context) and `user_name` their display name;
    `assistant_name` the assistant's name on its messages (default: the server's `bot_name`).
    `channel` fixes the conversation (default: the Memory's session id), `guild` its guild.
    `budget_tokens` and `include` shape the context as `AsyncClient.context` does."""

    name: str = Field(default="gieok", description="The block's name in the memory template.")
    client: AsyncClient = Field(exclude=True, description="The gieok client (its key decides the memory).")
    user: str = Field(description="Who the user's messages are from: their facts come into the context.")
    user_name: str | None = Field(default=None, description="The user's display name.")
    assistant_name: str | None = Field(default=None, description="The assistant's name on its messages.")
    channel: str | None = Field(default=None, description="The conversation's channel (default: the session id).")
    guild: str | None = Field(default=None, description="The conversation's guild, if it has one.")
    budget_tokens: int = Field(default=2000, description="The context's token budget.")
    include: list[str] | None = Field(default=None, description="Parts of the context (None: all).")

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        """gieok's context for the latest user message of `messages` (the chat and the new input)."""
        channel = self._channel(block_kwargs.get("session_id"))
        context = await self.client.context(channel, guild=self.guild, user=self.user,
                                            query=latest_user_text(messages or ()),
                                            budget_tokens=self.budget_tokens, include=self.include)
        return context.text

    async def _aput(self, messages: list[ChatMessage]) -> None:
        """Record the users' and assistants' messages among `messages` (those flushed from the
        short-term memory), in order. Each id is minted here, once, and kept by every retry of
        the request, so a retry stores nothing twice."""
        batch = uuid.uuid4().hex[:12]
        by_channel: dict[str, list[Message]] = {}
        for number, message in enumerate(messages):
            role = _ROLES.get(message.role)
            text = (message.content or "").strip()
            if role is None or not text:
                continue
            channel = self._channel(message.additional_kwargs.get("session_id"))
            by_channel.setdefault(channel, []).append(Message(
                id=f"li-{batch}-{number}", role=role, text=text, user=self.user if role == "user" else None,
                name=self.user_name if role == "user" else self.assistant_name))
        for channel, recorded in by_channel.items():
            await self.client.add_messages(channel, recorded, guild=self.guild)

    def _channel(self, session_id: Any) -> str:
        channel = self.channel or session_id
        if not isinstance(channel, str) or not channel:
            raise InvalidInputError("GieokMemoryBlock needs a conversation: give it a channel, or use it in a "
                                    "llama_index Memory (its session id is the channel)")
        return channel


def latest_user_text(messages: Sequence[ChatMessage]) -> str | None:
    """The text of the last user message (None when there is none): what gieok recalls for."""
    for message in reversed(messages):
        if _ROLES.get(message.role) == "user" and (message.content or "").strip():
            return (message.content or "").strip()
    return None

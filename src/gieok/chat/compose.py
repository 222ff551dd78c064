"""The one place the bot is put together: memory → model → conversation pipeline → bot core.

Every front-end asks here — the Discord bot, the terminal chat, `gieok bot --serve`, the server's
conversation routes and the benchmarks — so a new part of the chain (a guard, a tool, a shared
inbox) is wired once and reaches all of them. `build_pipeline` is the memory-and-judgement half
(what `gieok inspect-prompt` and a server that records conversations need); `build_bot` adds the
runtime that turns messages into replies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..memory import Memory
from .agent.pipeline import ConversationPipeline
from .conversation.memory import ConversationMemory
from .llm import create_llm, llm_configured
from .llm.base import LLM
from .runtime.core import BotCore, Outbox
from .runtime.shared_channels import SharedChannels
from .settings import ChatSettings, chat_settings

__all__ = ["Bot", "build_bot", "build_pipeline", "build_llm", "BUNDLED", "FROM_SETTINGS"]

BUNDLED = "bundled"  # the shipped stage-1 classifier (ConversationPipeline's default)


class _FromSettings:
    """The model the settings' `llm_chain` names (`create_llm`), made when the bot is built."""

    def __repr__(self) -> str:
        return "FROM_SETTINGS"


FROM_SETTINGS = _FromSettings()


def _model(llm: LLM | _FromSettings | None, settings: ChatSettings) -> LLM | None:
    return create_llm(settings) if isinstance(llm, _FromSettings) else llm


@dataclass
class Bot:
    """One bot: the memory it remembers with, its model, its pipeline and its runtime core."""

    memory: Memory
    llm: LLM | None
    pipeline: ConversationPipeline
    core: BotCore
    settings: ChatSettings

    async def aclose(self) -> None:
        """Finish what the core has queued, then close the model's connections (the memory is the caller's)."""
        await self.core.close()
        aclose = getattr(self.llm, "aclose", None)
        if aclose is not None:
            await aclose()


def build_llm(settings: ChatSettings) -> LLM | None:
    """The model chain the settings name, or None when they name none: a server that records
    agents' conversations keeps their summaries and facts with it, and says so when it has none."""
    return create_llm(settings) if llm_configured(settings) else None


def build_pipeline(settings: ChatSettings | None, memory: Memory, *, llm: LLM | _FromSettings | None = FROM_SETTINGS,
                   classifier: Any = BUNDLED, recover: bool = True, conversation: ConversationMemory | None = None,
                   clock: Callable[[], float] = time.time) -> ConversationPipeline:
    """The conversation pipeline over `memory`: L1–L3, the guard, the gatekeeper (stage 2 on `llm`: by
    default the settings' chain; None: heuristics only), recall and context assembly.
    `recover=False` leaves messages a crash left only in L1 to a runtime that shares the store
    with other processes (it writes each channel's under that channel's lease)."""
    chosen = chat_settings(settings if settings is not None else memory.settings)
    model = _model(llm, chosen)
    return ConversationPipeline(memory, settings=chosen, llm=model, classifier=classifier, recover=recover,
                                conversation=conversation, clock=clock)


def build_bot(settings: ChatSettings | None, memory: Memory, *, outbox: Outbox,
              llm: LLM | _FromSettings | None = FROM_SETTINGS,
              classifier: Any = BUNDLED, tools: Sequence[Any] | None = None, shared: SharedChannels | None = None,
              recover: bool | None = None, conversation: ConversationMemory | None = None,
              **core_options: Any) -> Bot:
    """The whole bot over `memory`, replying through `outbox`. `tools`: what the model may call
    (none by default; `default_tools(settings)` for the Discord bot's). `shared`: the Redis inboxes
    and leases of several bot processes (then a crash's leftovers are recovered per lease, not at
    start). `core_options` go to `BotCore` (clock, sleep, generate … in tests and benchmarks)."""
    chosen = chat_settings(settings if settings is not None else memory.settings)
    model = _model(llm, chosen)
    pipeline = build_pipeline(chosen, memory, llm=model, classifier=classifier,
                              recover=shared is None if recover is None else recover, conversation=conversation)
    core = BotCore(pipeline, model, outbox=outbox, settings=chosen, tools=tools, shared=shared, **core_options)
    return Bot(memory, model, pipeline, core, chosen)

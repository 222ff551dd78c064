"""What one server process holds: its settings, the key table, the tenants' memories, the
event bus, the webhooks, and the bot when one runs in the same process (`gieok bot --serve`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..chat.agent.pipeline import ConversationPipeline
from ..chat.compose import build_llm, build_pipeline
from ..chat.conversation.memory import ConversationMemory
from ..chat.llm.base import LLM
from ..coordination import RedisConnection, SharedEventLog
from ..errors import GieokError
from ..memory import Memory
from ..store.base import Store
from ..store.factory import open_store
from ..store.relay import EventRelayStore
from ..store.wait import ServiceWait
from .access import Access
from .auth import ApiKeys
from .duties import Duties
from .events import EventBus
from .sessions import LoginThrottle, Sessions
from .settings import ServerSettings
from .stopping import on_stop
from .tenants import TenantRegistry
from .warm import Readiness, start_warming, tenants_to_warm
from .webhooks import Webhooks

log = logging.getLogger("gieok.server")
SETTLE_SECONDS = 30.0  # a shutdown waits this long for turn blocks written behind
RELAY_TAKE_UP_SECONDS = 2.0  # a process closing waits this long for a server to take up a user's erasure it relayed
RELAY_READ_SECONDS = 1.0  # and gives the running servers this long to read it (they read every quarter second)

__all__ = ["ServerState"]


@dataclass
class ServerState:
    settings: ServerSettings
    keys: ApiKeys
    tenants: TenantRegistry
    bus: EventBus
    auth: bool = True  # False only on a loopback address (`--no-auth`): every caller is the default tenant's admin
    bot: Any = None  # a BotCore sharing this process, for /v1/health
    started: float = 0.0
    _keys_store: Store | None = field(default=None, repr=False)
    redis: RedisConnection | None = field(default=None, repr=False)  # with the `redis` setting: shared events
    readiness: Readiness = field(default_factory=Readiness)  # /readyz: warm yet? (server/warm.py)
    access: Access = field(init=False, repr=False)  # who a request is, and the tenant it may reach
    login_throttle: LoginThrottle = field(init=False, repr=False)  # the dashboard's failed logins
    llm: LLM | None = field(default=None, repr=False)  # the model chain of summaries and facts (None: off)
    _stop_warming: threading.Event = field(default_factory=threading.Event, repr=False)
    _warming: threading.Thread | None = field(default=None, repr=False)
    duties: Duties | None = field(default=None, repr=False)  # the background duties of this process
    _stop_duties: asyncio.Event | None = field(default=None, repr=False)
    stopping: threading.Event = field(default_factory=threading.Event, repr=False)  # the server began to stop
    _forget_stop_hook: Callable[[], None] | None = field(default=None, repr=False)
    _webhooks: Webhooks | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        settings = self.settings
        sessions = Sessions(self.keys.sessions, self.keys, idle_seconds=settings.server_session_idle_seconds,
                            max_seconds=settings.server_session_max_seconds)
        self.access = Access(self.keys, self.tenants, auth=self.auth, sessions=sessions)
        self.login_throttle = LoginThrottle(settings.server_login_attempts, settings.server_login_window_seconds)
        self._forget_stop_hook = on_stop(self.stopping.set)  # open event streams end when the server stops

    async def settle_writes(self, timeout_s: float = SETTLE_SECONDS) -> bool:
        """Wait, up to `timeout_s`, for the turn blocks the open tenants' pipelines write behind
        (`index: "behind"`), so a shutdown leaves none half made; `close` writes what is left then.
        False when the time ran out."""
        pipelines = self.tenants.open_pipelines()
        if not pipelines:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*(p.settle_all() for p in pipelines)), timeout_s)
        except TimeoutError:
            log.warning("shutdown: turn blocks still being written after %.0f s; the close writes what is left",
                        timeout_s)
            return False
        return True

    def _write_pending(self) -> None:
        """The turn blocks still unwritten when the event loop that wrote them behind is gone (a
        `gieok mcp` whose client closed stdin, a shutdown past `settle_writes`' wait): written now,
        before the memories close, rather than at the next start."""
        for pipeline in self.tenants.open_pipelines():
            try:
                pipeline.commit_pending()
            except Exception as exc:  # left in L1: the next start writes them
                log.warning("shutdown: turn blocks left for the next start: %s", exc)

    def start_duties(self) -> asyncio.Task[None] | None:
        """The background duties on this event loop (server/duties.py), once; None when turned off."""
        if self.duties is None and self.settings.server_duty_seconds > 0:
            self.duties = Duties(self.tenants, self.settings.server_duty_seconds)
            self._stop_duties = asyncio.Event()
            return asyncio.create_task(self.duties.run(self._stop_duties))
        return None

    def stop_duties(self) -> None:
        """Stop the timer (the round running finishes); a new start (another lifespan) may follow."""
        if self._stop_duties is not None:
            self._stop_duties.set()
        self.duties, self._stop_duties = None, None

    @property
    def webhooks(self) -> Webhooks:
        """The tenants' webhook endpoints, their outbox and the delivery loop (server/webhooks.py)."""
        if self._webhooks is None:
            raise RuntimeError("a ServerState is made by ServerState.open")
        return self._webhooks

    @property
    def warming(self) -> bool:
        """Warming started (the app's start-up) and is not done yet."""
        return self._warming is not None and not self.readiness.done.is_set()

    def start_warming(self) -> None:
        """Warm the tenants beside the running server, once (the app's start-up calls this)."""
        if self._warming is None:  # the key table is read in the warming thread: the database may be restarting
            def names() -> list[str]:
                return tenants_to_warm(self.tenants, self.keys.keys(), self.settings.server_open_tenants)

            self._warming = start_warming(self.tenants, names, self.readiness, self._stop_warming)

    def _settle_relayed_erasures(self) -> None:
        """Users' erasures this process wrote to the relay name the user, for the servers' buffers
        (`EventBus.relayed_erasures`): one written for the servers to take up (`gieok mcp`, `gieok
        forget-user`) is waited for, up to RELAY_TAKE_UP_SECONDS, and one a server told its siblings
        is given the time they take to read it (every quarter second); then they are deleted — a row
        no server took names the user for nobody (none runs; one that starts later holds nothing of
        theirs) — rather than left until some process next trims the relay, or for good."""
        relay, written = self.event_relay, self.bus.relayed_erasures
        if relay is None or not written:
            return
        try:
            waiting = [relay_id for relay_id, _, holder in written if holder is None]
            deadline = time.monotonic() + RELAY_TAKE_UP_SECONDS
            while time.monotonic() < deadline and any(row.claimed_by is None for row in relay.rows(waiting)):
                time.sleep(0.05)
            time.sleep(max(0.0, max(at for _, at, _ in written) + RELAY_READ_SECONDS - time.monotonic()))
            for holder in {holder for _, _, holder in written}:
                relay.withdraw([relay_id for relay_id, _, by in written if by == holder], claimed_by=holder)
        except GieokError as exc:  # the store is away: the next trim drops them (after a minute)
            log.warning("could not delete the users' erasures written to the event relay: %s", exc)
        written.clear()

    @property
    def event_relay(self) -> EventRelayStore | None:
        """The home store's event relay (store/relay.py): what `gieok mcp` writes, `gieok serve` streams."""
        return self._keys_store.event_relay if self._keys_store is not None else None

    @classmethod
    def open_without_stream(cls, settings: ServerSettings, who: str, log: logging.Logger) -> ServerState:
        """The deployment for a process with no event stream of its own (`gieok mcp`, an operator's
        `gieok forget-user`): PostgreSQL or Redis away, waited for (`startup_wait_seconds`, a line on
        `log` each try); its events go to the Redis stream, else to the home store's relay, which
        every `gieok serve` streams."""
        state = ServiceWait(who, settings.startup_wait_seconds, log=log)(cls.open, settings)
        if state.bus.shared is None:
            state.bus.relay = state.event_relay
        return state

    @classmethod
    def open(cls, settings: ServerSettings, *, auth: bool = True) -> ServerState:
        """Open the deployment whose home memory is `settings.db` (created if new)."""
        home = settings.db_location()
        redis = RedisConnection(settings.redis, settings.redis_namespace) if settings.redis else None
        try:
            store = open_store(home, busy_timeout_ms=settings.busy_timeout_ms)  # the key table lives in the home memory
        except BaseException:
            if redis is not None:
                redis.close()
            raise
        llm = build_llm(settings)

        def pipeline(memory: Memory, conversation: ConversationMemory) -> ConversationPipeline:
            """A tenant's conversation pipeline: the server's model for summaries and facts, the
            guard on what comes in, no stage 1 (an agent decides when it replies)."""
            own = memory.settings if isinstance(memory.settings, ServerSettings) else settings  # the tenant's zone
            return build_pipeline(own, memory, llm=llm, classifier=None, conversation=conversation)

        sequences = store.event_sequences  # event ids go on after a restart (in the home store)
        bus = EventBus(settings.event_buffer, sequences=sequences,
                       shared=SharedEventLog(redis, settings.event_buffer, sequences=sequences)
                       if redis is not None else None)
        webhooks = Webhooks(store.webhooks, settings)  # every event published is queued for its tenant's endpoints
        tenants = TenantRegistry(home, settings, max_open=settings.server_open_tenants,
                                 listener=webhooks.listener(bus), pipelines=pipeline,
                                 erased_elsewhere=bus.erased_elsewhere)
        return cls(settings, ApiKeys(store), tenants, bus, auth=auth, started=time.time(), _keys_store=store,
                   redis=redis, llm=llm, _webhooks=webhooks)

    def close(self) -> None:
        """Stop, write what is pending, and close every memory; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self._stop_warming.set()
        self._write_pending()
        if self._forget_stop_hook is not None:
            self._forget_stop_hook()
            self._forget_stop_hook = None
        self.tenants.close()
        self.bus.close()  # unused reserved event ids go back: the next process goes on from the last one
        self._settle_relayed_erasures()
        if self._keys_store is not None:
            self._keys_store.close()
            self._keys_store = None
        if self.redis is not None:
            self.redis.close()
            self.redis = None

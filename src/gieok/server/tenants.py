"""Where each tenant's memory lives, and the one place that opens it.

A tenant is a memory of its own: its own SQLite file, hash chain, indexes, working memory and
conversation tables. The `default` tenant is the deployment's home file (`--db`), the one the
Discord bot and the terminal chat use; every other tenant lives beside it in
`<home stem>.tenants/<tenant>.db`. Isolation is physical: no query can reach another tenant's
rows because they are in another file, and a request can name no file — the tenant comes from
the caller's key (`auth.Principal`) and only this registry turns it into a memory. On
PostgreSQL (`--db postgresql://…`) a tenant is a schema of the same database instead
(`<home schema>_<tenant>`), with tables of its own and a hash chain of its own.

Open memories are kept (their indexes are in RAM) up to `max_open`; beyond that the least
recently used idle one is closed (its HNSW graph saved). The embedding engine is shared by all
of them: one model per process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..chat.agent.gather import ContextGatherer
from ..chat.agent.pipeline import ConversationPipeline
from ..chat.conversation.memory import ConversationMemory
from ..config.settings import is_database_url
from ..errors import MemoryReembeddedError, StoreError
from ..memory import EventListener, Memory
from ..memory.events import ErasedElsewhere
from ..store.urls import display_url, tenant_schema, with_schema
from ..types import DEFAULT_TENANT
from .auth import check_tenant
from .settings import ServerSettings

PipelineFactory = Callable[[Memory, ConversationMemory], ConversationPipeline]  # the server's composition

__all__ = ["DEFAULT_TENANT", "Tenant", "TenantRegistry", "tenant_path", "tenant_location"]



def tenant_path(home: Path, tenant: str) -> Path:
    """The file of `tenant` in the deployment whose home memory is `home`."""
    check_tenant(tenant)
    if tenant == DEFAULT_TENANT:
        return home
    return home.with_name(f"{home.stem}.tenants") / f"{tenant}.db"


def tenant_location(home: str, tenant: str) -> str:
    """Where `tenant` lives in the deployment whose home memory is `home` (a file or a URL)."""
    check_tenant(tenant)
    if tenant == DEFAULT_TENANT:
        return home
    if is_database_url(home):
        return with_schema(home, tenant_schema(home, tenant))
    return str(tenant_path(Path(home), tenant))


@dataclass
class Tenant:
    """An open tenant: its memory and (opened on first use) its conversation layers."""

    name: str
    memory: Memory
    owned: bool = True  # False: attached by the caller (the bot's memory), never closed here
    users: int = 0
    retired: bool = False  # its memory was re-embedded elsewhere: closed when its last request is done
    _conversation: ConversationMemory | None = field(default=None, repr=False)
    _gatherer: ContextGatherer | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _pipeline: ConversationPipeline | None = field(default=None, repr=False)
    _pipelines: PipelineFactory | None = field(default=None, repr=False)

    @property
    def conversation(self) -> ConversationMemory:
        with self._lock:
            if self._conversation is None:
                self._conversation = ConversationMemory(self.memory)
            return self._conversation

    @property
    def gatherer(self) -> ContextGatherer:
        """What an agent's context reads (chat/agent/gather.py): the conversation layers and the
        memory's search, without the pipeline's guard and classifiers (a read judges nothing)."""
        conversation = self.conversation
        with self._lock:
            if self._gatherer is None:
                self._gatherer = ContextGatherer(conversation)
            return self._gatherer

    @property
    def pipeline(self) -> ConversationPipeline:
        """The conversation pipeline over this tenant's memory (an agent's messages and context),
        built on first use by the server's composition (seconds: the guard's classifiers load)."""
        conversation = self.conversation
        with self._lock:
            if self._pipeline is None:
                if self._pipelines is None:
                    raise StoreError("this tenant has no conversation pipeline (not opened by a server)")
                self._pipeline = self._pipelines(self.memory, conversation)  # not self.conversation: this lock
            assert self._pipeline.conversation is conversation
            return self._pipeline


class TenantRegistry:
    """Opens, shares and closes the tenants' memories (module docstring: where they live, how
    many stay open)."""

    def __init__(self, home: str | Path, settings: ServerSettings, *, max_open: int = 64,
                 listener: Callable[[str], EventListener | None] | None = None,
                 pipelines: PipelineFactory | None = None,
                 erased_elsewhere: Callable[[str], ErasedElsewhere | None] | None = None) -> None:
        self.location = str(home)  # a file path or a database URL
        self.home = Path(home)
        self.shown = display_url(self.location) if is_database_url(self.location) else self.location
        self.settings = settings
        self.max_open = max(1, max_open)
        self._listener = listener or (lambda tenant: None)
        self._erased_elsewhere = erased_elsewhere or (lambda tenant: None)
        self._pipelines = pipelines
        self._open: OrderedDict[str, Tenant] = OrderedDict()
        self._lock = threading.Lock()
        self._opening: dict[str, threading.Lock] = {}
        self._closed = False

    def attach(self, name: str, memory: Memory, conversation: ConversationMemory | None = None,
               pipeline: ConversationPipeline | None = None) -> Tenant:
        """Serve a memory the caller opened (the bot's, with `gieok bot --serve`, with its conversation
        layers and pipeline: one writer of its conversations); it stays the caller's to close."""
        tenant = Tenant(check_tenant(name), memory, owned=False, _conversation=conversation, _pipeline=pipeline,
                        _pipelines=self._pipelines)
        memory.listener = self._listener(name)
        memory.events.on_erased_elsewhere = self._erased_elsewhere(name)
        with self._lock:
            self._open[name] = tenant
        return tenant

    @contextmanager
    def use(self, name: str) -> Iterator[Tenant]:
        """The tenant's open memory for the length of one request (it is not closed meanwhile)."""
        tenant = self.acquire(name)
        try:
            yield tenant
        except MemoryReembeddedError:
            self.retire(tenant)
            raise
        finally:
            self.release(tenant)

    def refresh(self, name: str) -> None:
        """The tenant's memory hears now what other processes committed, and the events this process
        keeps of its blocks no longer live are redacted (`Memory.refresh`): before a replay of its
        stream, which may hold events of blocks another worker erased while this one had not read
        since, or had the memory closed (evicted)."""
        with self.use(name) as tenant:
            tenant.memory.refresh()

    def acquire_open(self, name: str) -> Tenant | None:
        """The tenant if its memory is open already (no I/O: an event loop may call this), held
        until `release`; None when it must be opened first (`acquire`, in a worker thread)."""
        check_tenant(name)
        with self._lock:
            if self._closed:
                raise StoreError("the server is shutting down")
            tenant = self._open.get(name)
            if tenant is not None:
                self._open.move_to_end(name)
                tenant.users += 1
            return tenant

    def release(self, tenant: Tenant) -> None:
        with self._lock:
            tenant.users -= 1
            close = tenant.retired and tenant.owned and tenant.users == 0
        if close:
            tenant.memory.close()

    def retire(self, tenant: Tenant) -> None:
        """A tenant whose memory another process re-embedded (`gieok reindex` while serving:
        `MemoryReembeddedError`): out of the open ones, so the next request opens the memory again
        with what it holds now; this one is closed when its last request is done."""
        with self._lock:
            if self._open.get(tenant.name) is tenant:
                del self._open[tenant.name]
            tenant.retired = True

    def acquire(self, name: str) -> Tenant:
        """The tenant's memory, opened if need be (seconds for a large one), held until `release`."""
        tenant = self.acquire_open(name)
        if tenant is not None:
            return tenant
        with self._lock:
            opening = self._opening.setdefault(name, threading.Lock())
        with opening:  # one thread opens a tenant; the others wait for it, not for every tenant
            with self._lock:
                tenant = self._open.get(name)
                if tenant is not None:
                    tenant.users += 1
                    return tenant
            memory = self._open_memory(name)
            with self._lock:
                tenant = Tenant(name, memory, users=1, _pipelines=self._pipelines)
                self._open[name] = tenant
                self._opening.pop(name, None)
                evicted = self._evict()
        for old in evicted:
            old.memory.close()
        return tenant

    def _open_memory(self, name: str) -> Memory:
        memory = Memory(tenant_location(self.location, name), settings=self.settings.for_tenant(name))
        try:
            memory.warm()  # the tenant's first search then runs at warm speed (opening is the slow part anyway)
        except BaseException:
            memory.close()
            raise
        memory.listener = self._listener(name)
        memory.events.on_erased_elsewhere = self._erased_elsewhere(name)
        return memory

    def _evict(self) -> list[Tenant]:
        """Idle owned tenants beyond `max_open`, least recently used first (under the lock)."""
        evicted = []
        for name in list(self._open):
            if len(self._open) <= self.max_open:
                break
            tenant = self._open[name]
            if tenant.owned and tenant.users == 0:
                evicted.append(self._open.pop(name))
        return evicted

    def open_pipelines(self) -> list[ConversationPipeline]:
        """The conversation pipelines this registry built for its open tenants (a shutdown settles
        their writes). Not an attached one: the bot's runtime writes its own, under its leases."""
        with self._lock:
            return [t._pipeline for t in self._open.values() if t.owned and t._pipeline is not None]

    def open_names(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def close(self) -> None:
        """Close every memory this registry opened (graphs saved, files closed)."""
        with self._lock:
            self._closed = True
            tenants = list(self._open.values())
            self._open.clear()
        for tenant in tenants:
            if tenant.owned:
                tenant.memory.close()

"""A Python client for `gieok serve`: the memory on another machine, used as if it were local.

    from gieok.client import Client
    with Client() as memory:    # $GIEOK_URL (else http://127.0.0.1:8420), the key $GIEOK_API_KEY / $GIEOK_KEY
        memory.add("민지: 고양이 이름은 보리야", scope={"channel": "general"}, speaker="민지")
        for hit in memory.search("민지 고양이 이름", k=3):
            print(hit.score, hit.block.text)

`Client` blocks, `AsyncClient` awaits; both have `Memory`'s method names, return the engine's
dataclasses (`Block`, `SearchResult`, `VerifyReport` …) and raise the engine's exceptions
(`AuthenticationError`, `PermissionDeniedError`, `BlockNotFoundError`, `InvalidInputError` …;
`ServerUnavailableError` when the server cannot be reached), each importable from here too
(`from gieok.client import Client, AuthenticationError`). The one dependency is httpx.
This package is part of the engine ring: it imports nothing of the chat, the server or the
command line (docs/server.md, "Python client").
"""

from ..errors import (
    AuthenticationError,
    BlockNotFoundError,
    EmbedderError,
    GieokError,
    InvalidInputError,
    InvalidTypeError,
    LLMError,
    NotFoundError,
    PermissionDeniedError,
    ServerError,
    ServerUnavailableError,
    StorageFullError,
    StoreError,
)
from ._async import AsyncClient
from ._sync import Client
from .types import (
    BlockPage,
    Context,
    ContextFact,
    ContextParts,
    Fact,
    Message,
    MessagesResult,
    RecalledTurn,
    RecentMessage,
    ServerStats,
    StoredMessage,
)

__all__ = ["Client", "AsyncClient", "Message", "MessagesResult", "StoredMessage", "Context", "ContextParts",
           "ContextFact", "RecalledTurn", "RecentMessage", "Fact", "ServerStats", "BlockPage",
           # what the clients raise: the engine's own classes, importable from here too
           "GieokError", "AuthenticationError", "PermissionDeniedError", "NotFoundError", "BlockNotFoundError",
           "InvalidInputError", "InvalidTypeError", "LLMError", "StoreError", "EmbedderError", "ServerError",
           "ServerUnavailableError", "StorageFullError"]

"""Storage backends behind the `Store` port (blocks, layers, conversation, keys). SQLite is the
embedded default; `open_store` picks the backend from the `db` setting."""

from .base import BlockStore, BM25Filter, IndexRows, NewBlock, Store, VerifyReport
from .conversation import ConversationStore
from .factory import is_database_url, open_store
from .keys import KeyStore
from .layer_tables import LayerStore
from .sqlite import SQLiteStore

__all__ = ["Store", "BlockStore", "LayerStore", "ConversationStore", "KeyStore", "SQLiteStore", "open_store",
           "is_database_url", "NewBlock", "IndexRows", "BM25Filter", "VerifyReport"]

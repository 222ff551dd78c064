"""What several gieok processes share at run time besides the store, in Redis: the connection
(`RedisConnection`) and the live event stream (`SharedEventLog`). The chat runtime's per-channel
inboxes, leases and rate limits build on the same connection (`gieok.chat.runtime.shared_channels`).
Without a `redis` setting none of this is used and everything works in one process."""

from .connection import RedisConnection, check_redis_url, display_redis_url
from .events import Event, SharedEventLog

__all__ = ["RedisConnection", "check_redis_url", "display_redis_url", "SharedEventLog", "Event"]

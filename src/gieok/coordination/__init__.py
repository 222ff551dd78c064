"""What several gieok processes share at run time besides the store, in Redis: the chat
runtime's per-channel inboxes, leases, claims, rate limits and active channels
(`SharedChannels`), and the live event stream (`SharedEventLog`). Without a `redis` setting none
of this is used and everything works in one process."""

from .channels import WAKE_ACTIVE, WAKE_INBOX, SharedChannels
from .connection import RedisConnection, check_redis_url, display_redis_url
from .events import Event, SharedEventLog

__all__ = ["RedisConnection", "check_redis_url", "display_redis_url", "SharedChannels", "WAKE_INBOX", "WAKE_ACTIVE",
           "SharedEventLog", "Event"]

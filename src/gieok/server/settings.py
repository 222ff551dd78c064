"""The server's settings (`gieok serve`, `gieok mcp`, `gieok bot --serve`): where it listens, how
much it accepts, how many tenants it keeps open, the key `gieok mcp` acts with. `ServerSettings`
adds these to the chat's (the server runs conversations too); `[server]` is their table in
`gieok.toml` (docs/configuration.md, "Server")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..chat.settings import ChatSettings
from ..config.settings import at_least, between, not_blank, not_negative, positive, setting, time_zone
from ..config.values import comma_list, split_items
from ..errors import ConfigError

__all__ = ["ServerSettings"]


def tenant_zones(value: Any) -> tuple[tuple[str, str], ...]:
    """`"acme=Europe/Berlin, beta=America/New_York"` → `(("acme", "Europe/Berlin"), …)`: the time zone
    each of these tenants' times are read and shown in (the others: `timezone`)."""
    pairs: dict[str, str] = {}
    for item in split_items(value, ",\n"):
        tenant, equals, zone = item.partition("=")
        tenant, zone = tenant.strip(), zone.strip()
        if not equals or not tenant or not zone:
            raise ConfigError(f"tenant_timezones entries look like 'tenant=Area/City', got {item!r}")
        problem = time_zone(zone)
        if problem:
            raise ConfigError(f"tenant_timezones: {tenant}'s zone {problem}, got {zone!r}")
        pairs[tenant] = zone
    return tuple(pairs.items())


@dataclass(frozen=True, repr=False)  # Settings.__repr__ keeps secrets out
class ServerSettings(ChatSettings):
    """The server's settings, on top of the chat's and the engine's."""

    SECTION: ClassVar[str] = "server"

    server_host: str = setting("127.0.0.1", not_blank)
    server_port: int = setting(8420, between(1, 65535))
    server_max_body_bytes: int = setting(1_048_576, at_least(1024))  # a larger request body is refused (413)
    server_max_import_bytes: int = setting(268_435_456, at_least(1024))  # …except POST /v1/import, up to this
    server_open_tenants: int = setting(64, at_least(1))  # tenant memories kept open (least recently used closed)
    api_key: str = setting("", secret=True)  # the key `gieok mcp` (stdio) acts with; GIEOK_API_KEY
    # how often the open tenants' background duties run (STM expiry, extraction of quiet conversations);
    # one worker at a time per tenant, by a lease in the tenant's store; 0 turns them off
    server_duty_seconds: float = setting(60.0, not_negative)
    # Host names a `--no-auth` server answers to besides the loopback ones (`--allow-host`; comma-separated)
    server_allowed_hosts: tuple[str, ...] = setting((), parse=comma_list)
    # behind a TLS proxy: trust its X-Forwarded-Proto / -For (`--proxy-headers`) from these addresses
    server_proxy_headers: bool = False
    server_forwarded_allow_ips: str = setting("127.0.0.1", not_blank)
    # the dashboard's sessions: ended after this long unused, and this long after login whatever happens
    server_session_idle_seconds: float = setting(3600.0, positive)
    server_session_max_seconds: float = setting(43_200.0, positive)
    # login throttling: this many failed logins in the window, from one client or for one key prefix, and
    # further logins from there wait (429) until the oldest failure leaves the window
    server_login_attempts: int = setting(5, at_least(1))
    server_login_window_seconds: float = setting(300.0, positive)
    # tenants whose users live elsewhere: their own time zone ("acme=Europe/Berlin, beta=UTC"), for the times a
    # request gives without a zone and every date shown to a model; other tenants use `timezone`
    tenant_timezones: tuple[tuple[str, str], ...] = setting((), parse=tenant_zones)
    # webhooks (server/webhooks.py): an attempt's time limit; after a failure the next attempt comes
    # webhook_retry_seconds later, doubling (with jitter) up to webhook_retry_max_seconds, until the event is
    # webhook_give_up_seconds old (then it is failed); webhook_public_only: public addresses only (shared hosting)
    webhook_timeout_seconds: float = setting(5.0, positive)
    webhook_retry_seconds: float = setting(5.0, positive)
    webhook_retry_max_seconds: float = setting(3600.0, positive)
    webhook_give_up_seconds: float = setting(86_400.0, positive)
    webhook_public_only: bool = False
    # how often a process looks for deliveries due (other workers' events, retries); its own events are posted
    # at once. 0: this process posts none (another one does)
    webhook_poll_seconds: float = setting(1.0, not_negative)

    def for_tenant(self, tenant: str) -> ServerSettings:
        """These settings as one tenant's memory reads them (its own `timezone`, if it has one)."""
        zone = dict(self.tenant_timezones).get(tenant)
        return self if zone is None or zone == self.timezone else self.with_overrides(timezone=zone)

"""Working memory, STM and the cache key their state by a scope, as one stable string."""

from __future__ import annotations

import json

from ..types import Scope


def scope_key(scope: Scope) -> str:
    return json.dumps([scope.guild, scope.channel, scope.user], ensure_ascii=False, separators=(",", ":"))


def scope_from_key(key: str) -> Scope:
    guild, channel, user = json.loads(key)
    return Scope(guild, channel, user)


def scope_label(key: str) -> str:
    """Human-readable form of a scope key: "guild=g1 channel=general"."""
    scope = scope_from_key(key)
    parts = [f"{name}={value}" for name, value in (("guild", scope.guild), ("channel", scope.channel),
                                                     ("user", scope.user)) if value is not None]
    return " ".join(parts) or "(global)"

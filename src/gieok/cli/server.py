"""`gieok serve` (REST + live events + MCP over HTTP) and `gieok keys` (create, list, revoke the
API keys the server checks). cli.py merges these apps into its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..config.settings import is_database_url
from ..errors import InvalidInputError, MissingExtraError
from ..server.auth import ROLES, ApiKeys
from ..store.factory import open_store
from ..store.urls import display_url
from .options import DbOption, JsonFlag, RedisOption, err, given, load, out

__all__ = ["server_commands", "keys_commands"]

server_commands = typer.Typer()
keys_commands = typer.Typer(help="API keys of `gieok serve`: create, list, revoke. Keys live in the --db memory: "
                                 "give gieok serve the same --db.\n\nExample: gieok keys create --tenant acme "
                                 "--role write --db chat.db", no_args_is_help=True)


@contextmanager
def _keys(db: DbOption) -> Iterator[tuple[ApiKeys, str]]:
    """The key table of the --db memory, and that memory as a user should see it (`_shown`)."""
    settings = load(**({"db": str(db)} if db else {}))
    location = settings.db_location()
    store = open_store(location, busy_timeout_ms=settings.busy_timeout_ms)
    try:
        yield ApiKeys(store), _shown(location)
    finally:
        store.close()


def _shown(location: str) -> str:
    """Which memory holds the keys: a file's absolute path (a key made for one file is unknown to
    a server started on another, the usual reason a fresh key gets 401), or the database URL
    without its password."""
    return display_url(location) if is_database_url(location) else str(Path(location).resolve())


@server_commands.command()
def serve(
    db: DbOption = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on. Default: 127.0.0.1 (server_host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port. Default: 8420 (server_port).")] = None,
    workers: Annotated[int, typer.Option(help="Worker processes sharing the memory files.")] = 1,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="No API keys: every caller is the default tenant's "
                                                            "admin. Refused unless the host is a loopback "
                                                            "address.")] = False,
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", help="A Host name a --no-auth server answers to besides the loopback ones (repeatable; "
                             "server_allowed_hosts). Any other Host gets 421.")] = None,
    proxy_headers: Annotated[bool, typer.Option(
        "--proxy-headers", help="Behind a TLS proxy: trust its X-Forwarded-Proto and X-Forwarded-For from "
                                "server_forwarded_allow_ips (127.0.0.1); cookies are then Secure "
                                "(docs/security.md).")] = False,
    redis: RedisOption = None,
) -> None:
    """Serve the memory over HTTP: REST API (/v1, docs at /docs), live events (/v1/events), MCP (/mcp).

    Every request carries `Authorization: Bearer <key>` (gieok keys create). The --db file is the
    default tenant's memory; other tenants' memories live beside it in <name>.tenants/. With
    --redis, every worker and every bot process on the same Redis feeds one event stream.

    Example: gieok keys create --tenant default --role write --db chat.db && gieok serve --db chat.db --port 8420
    """
    try:  # uvicorn and FastAPI (the server extra) load only for this command
        from ..server.run import serve as run_server
    except ImportError as exc:
        raise MissingExtraError("gieok serve", "server", exc.name) from None

    settings = load(**given(db, redis))
    if allow_host:
        settings = settings.with_overrides(server_allowed_hosts=tuple(allow_host))
    if proxy_headers:
        settings = settings.with_overrides(server_proxy_headers=True)
    run_server(settings, host=host, port=port, workers=workers, auth=not no_auth)


@server_commands.command("mcp")
def mcp(
    db: DbOption = None,
    key: Annotated[str | None, typer.Option(
        "--key", help="The API key to act with (gieok keys create); it decides the tenant and the role. "
                      "Default: $GIEOK_API_KEY (api_key), which keeps it out of the process list.",
        show_default=False)] = None,
    server: Annotated[str | None, typer.Option(
        "--server", help="Relay to a running gieok serve at this URL (its /mcp) instead of opening --db here: "
                         "answers within a second of the spawn, the memory stays warm in the server.",
        show_default=False)] = None,
) -> None:
    """Serve the memory to a local MCP client over stdio (Claude Desktop, IDEs, agents).

    stdin/stdout carry the MCP protocol and nothing else; logs go to stderr.

    The key is checked against the keys of --db before anything starts: without a valid one it exits 1.
    With --server the process opens no memory: it relays each message to that gieok serve, which
    checks the key on every one (a server that does not answer, or refuses the key, is exit 1).

    Tools: remember, search_memory, get_memory, forget_memory, list_facts, conversation_summary and more
    (docs/server.md).

    Example: GIEOK_API_KEY=gk_… gieok mcp --db ~/gieok/chat.db
    Example: GIEOK_API_KEY=gk_… gieok mcp --server http://127.0.0.1:8420
    """
    if server is not None:
        if db is not None:
            raise InvalidInputError("--db and --server: give one (with --server the server's memory is used)")
        from ..client.mcp_relay import McpRelay, RelayError

        settings = load()
        try:
            relay = McpRelay(server, key if key is not None else settings.api_key)
            relay.check()
        except RelayError as exc:
            raise InvalidInputError(str(exc)) from None
        relay.run()
        return
    try:  # the MCP SDK and FastAPI (the server extra) load only for this command
        from ..server.mcp import run_stdio
    except ImportError as exc:
        raise MissingExtraError("gieok mcp", "server", exc.name) from None

    settings = load(**({"db": str(db)} if db else {}))
    run_stdio(settings, key if key is not None else settings.api_key)


@keys_commands.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Whose memory the key opens (lowercase letters, digits, - and _; "
                                             "'default' is the --db file itself).")],
    role: Annotated[str, typer.Option(help="read | write | admin (admin also manages the tenant's keys).")] = "read",
    name: Annotated[str, typer.Option(help="A label to recognise the key by.")] = "",
    db: DbOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Create an API key and print it once (only its hash is stored, in the --db memory).

    The key goes to stdout alone (export GIEOK_KEY="$(gieok keys create …)" keeps it); which
    memory holds it goes to stderr (with --json, "db"). Start gieok serve with the same --db.

    Example: gieok keys create --tenant acme --role write --name "support bot" --db chat.db
    """
    if role not in ROLES:
        raise InvalidInputError(f"--role must be one of {', '.join(ROLES)}, got {role!r}")
    with _keys(db) as (keys, where):
        key, row = keys.create(tenant, role, name)
    if as_json:
        out.print_json(json.dumps({"key": key, **row.as_dict(), "db": where}, ensure_ascii=False))
        return
    out.print(key, highlight=False, soft_wrap=True)
    err.print(f"key {row.key_id} ({row.prefix}) for tenant {row.tenant}, role {row.role}, in {where} "
              f"(gieok serve --db {where}); store it now, it is not shown again", highlight=False, soft_wrap=True)


def _when(value: float | None) -> str:
    return "-" if value is None else datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M UTC")


@keys_commands.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    db: DbOption = None,
    as_json: JsonFlag = False,
) -> None:
    """List API keys (never the keys themselves): id, prefix, tenant, role, name, use, revocation.

    Example: gieok keys list --tenant acme
    """
    with _keys(db) as (keys, where):
        rows = keys.keys(tenant)
    if as_json:
        out.print_json(json.dumps([row.as_dict() for row in rows], ensure_ascii=False))
        return
    table = Table(title=f"{len(rows)} key(s) in {where}")
    for column in ("id", "prefix", "tenant", "role", "name", "created", "last used", "revoked"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row.key_id), row.prefix, row.tenant, row.role, row.name or "-", _when(row.created_at),
                      _when(row.last_used_at), _when(row.revoked_at))
    out.print(table)


@keys_commands.command("revoke")
def keys_revoke(
    key_id: Annotated[int, typer.Argument(help="The key's id (gieok keys list).")],
    db: DbOption = None,
) -> None:
    """Revoke a key; a running server refuses it from its next request on.

    Example: gieok keys revoke 3
    """
    with _keys(db) as (keys, where):
        if not keys.revoke(key_id):
            raise InvalidInputError(f"no live key with id {key_id} in {where}")
    out.print(f"revoked key {key_id} in {where}", highlight=False, soft_wrap=True)

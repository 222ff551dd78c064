"""PostgreSQL URLs as gieok reads them, without needing the driver: `schema` is gieok's own
query parameter (the schema that holds one memory; default `gieok`), and a URL shown anywhere
has its password masked."""

from __future__ import annotations

import hashlib
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import InvalidInputError

__all__ = ["DEFAULT_SCHEMA", "split_url", "display_url", "with_schema", "tenant_schema"]

DEFAULT_SCHEMA = "gieok"
_MAX_IDENTIFIER = 63  # PostgreSQL truncates longer names silently: never make one


def _check_schema(schema: str) -> str:
    ok = schema and schema.isascii() and schema.replace("_", "").replace("-", "").isalnum()
    if not ok or len(schema) > _MAX_IDENTIFIER or not schema[0].isalpha():
        raise InvalidInputError(f"schema must be 1–63 ASCII letters, digits, '_' or '-', starting with a letter, "
                                f"got {schema!r}")
    return schema.lower()


def split_url(url: str) -> tuple[str, str]:
    """(the connection string without `schema`, the schema)."""
    parts = urlsplit(url)
    schema = DEFAULT_SCHEMA
    kept = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "schema":
            schema = value
        else:
            kept.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(kept))), _check_schema(schema)


def with_schema(url: str, schema: str) -> str:
    """The same database, another schema."""
    parts = urlsplit(url)
    kept = [(n, v) for n, v in parse_qsl(parts.query, keep_blank_values=True) if n != "schema"]
    return urlunsplit(parts._replace(query=urlencode([*kept, ("schema", _check_schema(schema))])))


def tenant_schema(home_url: str, tenant: str) -> str:
    """The schema of a tenant of the deployment whose home memory is at `home_url`: its own
    tables beside the home schema's, in the same database."""
    name = f"{split_url(home_url)[1]}_{tenant}"
    if len(name) > _MAX_IDENTIFIER:
        name = f"{name[:48]}_{hashlib.blake2b(name.encode(), digest_size=6).hexdigest()}"
    return name


def display_url(url: str) -> str:
    """The URL with its password replaced: what may appear in logs, stats and errors."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))

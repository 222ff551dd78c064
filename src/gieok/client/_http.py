"""The one request path of both clients, written once without I/O.

`exchange` is a generator: it builds a request (key, idempotency key, JSON body), then yields
what it needs done — `Send(request)` or `Sleep(seconds)` — and is sent back what happened (the
response, or the connection error). It alone decides what an answer means, which failures are
retried, how long to wait and which exception a refusal becomes. `Client` runs these steps with
blocking calls and `AsyncClient` with awaits (`_drive` in each, a dozen lines); neither knows
any policy, so the two cannot drift apart. The methods' own plans (`_api.py`) are generators of
the same steps that `yield from exchange(...)`, so a plan of several requests (a long batch)
is written once too.
"""

from __future__ import annotations

import email.utils
import functools
import os
import random
import ssl
import time
import uuid
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

import httpx

from .. import __version__
from ..errors import AuthenticationError, InvalidInputError, ServerError, ServerUnavailableError
from ._errors import error_for

__all__ = ["Call", "Connection", "Send", "Sleep", "Step", "Outcome", "Plan", "exchange", "json_of", "mapping_of",
           "retry_after", "api_key_from_env", "base_url_from_env", "connect", "tls_context", "CONNECT_TIMEOUT",
           "DEFAULT_URL", "IDEMPOTENCY_HEADER"]

DEFAULT_URL = "http://127.0.0.1:8420"
CONNECT_TIMEOUT = 10.0  # seconds to reach the server; the answer itself may take minutes (see Client)
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_BACKOFF_S = 30.0  # one exponential wait never grows past this
MAX_RETRY_AFTER_S = 60.0  # a server asking for longer is waited on this long, then asked again

T = TypeVar("T")


@functools.cache
def tls_context() -> ssl.SSLContext:
    """What every client of this process verifies an https:// server with: httpx's own default
    (certifi's certificates, or `SSL_CERT_FILE` / `SSL_CERT_DIR`), built once. Each httpx client
    otherwise builds one when it is made — ~40 ms of CPU reading the certificates, even for an
    http:// server — and a framework may make a client per turn (LangChain makes the message history,
    and with it a `Client`, for each call). An `SSLContext` is safe to share between threads."""
    return httpx.create_ssl_context()


@dataclass(frozen=True, slots=True)
class Call:
    """One logical request. `write`: it changes the memory, so it carries an Idempotency-Key —
    minted here, once, and sent unchanged on every retry of this call. `accept`: error statuses
    that are an answer, not a failure (503 for `/readyz`). `block`: the block a 404 is about.
    `retries`: this call's own limit (None: the client's)."""

    method: str
    path: str
    body: Any = None
    params: Sequence[tuple[str, str]] = ()
    write: bool = False
    auth: bool = True
    accept: frozenset[int] = frozenset()
    block: int | None = None
    retries: int | None = None
    idempotency_key: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass(frozen=True, slots=True)
class Send:
    """Step: send this request and send back the response (or the `httpx.RequestError`)."""

    request: httpx.Request


@dataclass(frozen=True, slots=True)
class Sleep:
    """Step: wait this long (a retry's backoff), then send back None."""

    seconds: float


Step: TypeAlias = Send | Sleep
Outcome: TypeAlias = httpx.Response | httpx.RequestError | None
Plan: TypeAlias = Generator[Step, Outcome, T]


def base_url_from_env() -> str:
    """`GIEOK_URL`, else `DEFAULT_URL` (what `gieok serve` listens on by default)."""
    return os.environ.get("GIEOK_URL", "").strip() or DEFAULT_URL


def api_key_from_env() -> str | None:
    """`GIEOK_API_KEY` (what `gieok mcp` reads), else `GIEOK_KEY` (what the docs export)."""
    return os.environ.get("GIEOK_API_KEY") or os.environ.get("GIEOK_KEY") or None


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the server is and how hard to try: what every call of one client shares."""

    base_url: str
    api_key: str | None
    retries: int
    backoff: float

    def request(self, call: Call) -> httpx.Request:
        headers = {"Accept": "application/json", "User-Agent": f"gieok-client/{__version__}"}
        if call.auth:
            if not self.api_key:
                raise AuthenticationError(
                    f"no API key for the gieok server at {self.base_url}: pass api_key= or set GIEOK_API_KEY "
                    "(or GIEOK_KEY); `gieok keys create --db <the server's --db>` makes one")
            headers["Authorization"] = f"Bearer {self.api_key}"
        if call.write:
            headers[IDEMPOTENCY_HEADER] = call.idempotency_key
        try:
            return httpx.Request(call.method, self.base_url + call.path, params=list(call.params) or None,
                                 json=call.body, headers=headers)
        except (TypeError, ValueError) as exc:  # a value JSON cannot carry (an object, NaN)
            raise InvalidInputError(f"{call.method} {call.path}: the request cannot be sent as JSON: {exc}") from None

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """How long to wait before retry number `attempt` (1, 2, …): what the server asked for
        (Retry-After), else exponential backoff with jitter, so that clients failing together do
        not come back together."""
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER_S)
        return min(self.backoff * 2 ** (attempt - 1), MAX_BACKOFF_S) * random.uniform(0.5, 1.0)


def connect(base_url: str | None, api_key: str | None, *, retries: int, backoff: float) -> Connection:
    """A client's connection settings, checked: the URL and key given, else the environment's."""
    if base_url is None:
        base_url = base_url_from_env()
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise InvalidInputError(f"base_url must be an http:// or https:// URL, not {base_url!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidInputError(f"retries must be a whole number, 0 or more, not {retries!r}")
    if not isinstance(backoff, int | float) or backoff < 0:
        raise InvalidInputError(f"backoff must be seconds, 0 or more, not {backoff!r}")
    # only a key not given is the environment's: an empty one given (a tenant's key missing from the
    # caller's own config) must not become another tenant's from GIEOK_API_KEY
    return Connection(base_url.rstrip("/"), api_key if api_key is not None else api_key_from_env(), retries,
                      float(backoff))


def _retryable(error: httpx.RequestError) -> bool:
    """Failures where the request may not have reached the server, or its answer was lost:
    refused or reset connections and timeouts. A malformed URL or a TLS setup error is not."""
    return isinstance(error, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError)


def retry_after(response: httpx.Response) -> float | None:
    """Retry-After in seconds (either form: a number of seconds or an HTTP date), or None."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def exchange(connection: Connection, call: Call) -> Generator[Step, Outcome, httpx.Response]:
    """Send `call`, retrying connection failures and 503s up to the retry limit; the 2xx (or
    accepted) response, or the exception the failure maps to."""
    request = connection.request(call)
    retries = connection.retries if call.retries is None else call.retries
    attempt = 0
    while True:
        outcome = yield Send(request)
        attempt += 1
        if isinstance(outcome, httpx.Response):
            status = outcome.status_code
            if 200 <= status < 300 or status in call.accept:
                return outcome
            if status == 503 and attempt <= retries:
                yield Sleep(connection.delay(attempt, retry_after(outcome)))
                continue
            raise error_for(outcome, call.method, call.path, connection.base_url, block=call.block, attempts=attempt)
        if not isinstance(outcome, httpx.RequestError):
            raise TypeError(f"a driver sent {type(outcome).__name__} back for a request")
        if _retryable(outcome) and attempt <= retries:
            yield Sleep(connection.delay(attempt, None))
            continue
        reason = str(outcome) or type(outcome).__name__
        tried = f" (tried {attempt} times)" if attempt > 1 else ""
        raise ServerUnavailableError(f"cannot reach the gieok server at {connection.base_url} "
                                     f"({call.method} {call.path}): {reason}{tried}") from outcome


def json_of(response: httpx.Response) -> Any:
    """The response's JSON body; an answer that is not JSON is the server's failure, said so."""
    try:
        return response.json()
    except ValueError:
        raise ServerError(f"{response.request.method} {response.request.url.path}: the server answered "
                          f"{response.status_code} with a body that is not JSON", response.status_code) from None


def mapping_of(response: httpx.Response) -> Mapping[str, Any]:
    data = json_of(response)
    if not isinstance(data, Mapping):
        raise ServerError(f"{response.request.method} {response.request.url.path}: the server answered "
                          f"{type(data).__name__}, not a JSON object", response.status_code)
    return data

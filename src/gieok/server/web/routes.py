"""The dashboard's routes: six pages (overview, search, conversations, facts, users, live), a block
with its neighbouring turns, a user's page, the login form, and the small fragments htmx swaps
into a page.

Who the caller is comes from the same place as for the REST API (`deps.principal_of`: the
session cookie, which holds an opaque session id opened by logging in with a key) and their memory only from
`state.access.tenant(principal)`; no page or form takes a tenant. A page request without a
valid session is sent to /login (htmx requests get `HX-Redirect`); a refused one gets an HTML
error page with the REST API's status (403, 404, 400). Read keys see everything of their tenant;
write and admin keys may also forget a fact or a user and run verify; admin keys alone may
download everything held about a user and erase a user from the Users page (an access request
and an erasure are an admin's, as in the REST API: the routes stay behind their routers' page and
form gates and check the admin role in the handler). Forms that change anything are POSTs
checked for this server's Origin (security.py).

Handlers are plain functions, so FastAPI runs them in worker threads: SQLite, the embedder and
template rendering never hold up the event loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlencode
from zoneinfo import ZoneInfo

from anyio import from_thread
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape

from ... import __version__
from ...chat.conversation.memory import check_id
from ...errors import AuthenticationError, GieokError, InvalidInputError, NotFoundError
from ...memory.ingest import MAX_BLOCK_INDEX
from ...text.dates import calendar_time
from ..auth import Principal
from ..deps import principal_of, server_state
from ..errors import status_of
from ..tenants import Tenant
from . import views
from .security import SECURITY_HEADERS, SESSION_COOKIE, check_origin, clear_session, safe_next, set_session

__all__ = ["ROUTERS", "PageRoute", "TEMPLATES_DIR", "STATIC_DIR", "render"]

HERE = Path(__file__).parent
TEMPLATES_DIR = HERE / "templates"
STATIC_DIR = HERE / "static"
MODES = ("hybrid", "bm25", "vector")
KINDS = ("turn", "fact", "note", "summary")
MAX_K = 50
LIVE_BACKLOG = 200  # events the live page replays when it opens


class PageRoute(APIRoute):
    """A dashboard route: a caller without a session goes to the login page, and an engine
    error becomes an HTML page with its status instead of the REST API's JSON body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page(request: Request) -> Response:
            try:
                return await handler(request)
            except AuthenticationError:
                return _to_login(request)
            except GieokError as exc:
                status, _ = status_of(exc)
                return render(request, "error.html", None, status=status, message=str(exc))
            except RequestValidationError as exc:
                problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
                                     for e in exc.errors()[:5])
                return render(request, "error.html", None, status=400, message=problems or "invalid request")

        return page


# The dashboard's routers, by what a caller needs: none (login, logout), a session of any role (pages),
# or a write session and a form sent from these pages (forms). The gates are router-level.
router = APIRouter(route_class=PageRoute, include_in_schema=False)


# -- rendering -------------------------------------------------------------------------------------

def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES_DIR), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(size=_size, ms=_ms, pct=_pct, duration=_duration, mentions=_mentions, num=_num)
    env.globals.update(version=__version__, BREAKDOWN=views.BREAKDOWN, TIMINGS=views.TIMINGS, MODES=MODES,
                       KINDS=KINDS)
    return env



def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _ms(value: Any) -> str:
    value = float(value or 0.0)
    return f"{value:.2f} ms" if value < 10 else f"{value:.0f} ms"


def _pct(value: Any) -> str:
    return f"{100 * float(value or 0.0):.0f}%"


def _num(value: Any, places: int = 3) -> str:
    return "–" if value is None else f"{float(value):.{places}f}"


def _duration(seconds: Any) -> str:
    s = max(0, int(float(seconds or 0)))
    if s < 90:
        return f"{s} s"
    if s < 90 * 60:
        return f"{round(s / 60)} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def _mentions(text: Any) -> Markup:
    """Escape the text, then show each `<user:ID>` (how facts and summaries name people) as a chip."""
    out = str(escape(str(text or "")))
    for raw in {part.split("&gt;", 1)[0] for part in out.split("&lt;user:")[1:]}:
        out = out.replace(f"&lt;user:{raw}&gt;", f'<span class="mention">@{raw}</span>')
    return Markup(out)


def _clock(request: Request) -> Callable[[Any], str]:
    try:
        zone = ZoneInfo(server_state(request).settings.timezone)
    except Exception:
        zone = ZoneInfo("UTC")

    def when(epoch: Any, seconds: bool = False) -> str:
        if epoch in (None, ""):
            return "–"
        moment = calendar_time(float(epoch), zone)
        if moment is None:
            return f"? ({epoch} s)"
        return moment.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")

    return when


TEMPLATES = _templates()


def render(request: Request, name: str, who: Principal | None, *, status: int = 200, **context: Any) -> HTMLResponse:
    state = server_state(request)
    html = TEMPLATES.get_template(name).render(
        request=request, who=who, can_write=bool(who and who.can("write")),
        can_admin=bool(who and who.can("admin")), auth=state.auth,
        when=_clock(request), path=request.url.path, **context)
    return HTMLResponse(html, status_code=status, headers={**SECURITY_HEADERS, "Vary": "HX-Request, HX-Target"})


def _fragment(request: Request, target: str) -> bool:
    """Whether htmx asked for the part of the page with this id (a history restore wants it all)."""
    headers = request.headers
    return (headers.get("hx-request") == "true" and headers.get("hx-target") == target
            and headers.get("hx-history-restore-request") != "true")


def _to_login(request: Request) -> Response:
    target = "/login"
    if request.method == "GET" and request.url.path not in ("/", "/login"):
        target += "?" + urlencode({"next": request.url.path + (f"?{request.url.query}" if request.url.query else "")})
    if request.headers.get("hx-request") == "true":
        return Response(status_code=401, headers={"HX-Redirect": target, **SECURITY_HEADERS})
    return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)


# -- who is asking --------------------------------------------------------------------------------

def viewer(request: Request) -> Principal:
    """Any valid session (or key); read is every role's."""
    who = principal_of(request)
    who.require("read")
    return who


def editor(request: Request, who: Annotated[Principal, Depends(viewer)]) -> Principal:
    """A form that changes the memory: sent from this dashboard, by a write or admin key."""
    check_origin(request)
    who.require("write")
    return who


async def form_fields(request: Request) -> dict[str, str]:
    """An urlencoded form body (bounded by the server's body limit), one value per field."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise InvalidInputError("expected a form (application/x-www-form-urlencoded)")
    try:
        text = (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError("the form is not UTF-8") from None
    return {name: values[-1] for name, values in parse_qs(text, keep_blank_values=True).items()}


Viewer = Annotated[Principal, Depends(viewer)]
Editor = Annotated[Principal, Depends(editor)]
Form = Annotated[dict[str, str], Depends(form_fields)]
pages = APIRouter(route_class=PageRoute, include_in_schema=False, dependencies=[Depends(viewer)])
forms = APIRouter(route_class=PageRoute, include_in_schema=False, dependencies=[Depends(editor)])
ROUTERS = [router, pages, forms]


def _id(value: str | None, what: str) -> str | None:
    value = (value or "").strip()
    return check_id(value, what) if value else None


def _int(value: str | None, what: str) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be a number") from None


def _block_number(block_index: int, what: str = "block") -> int:
    """A block index a page was given: one no store holds (negative, or past what a database
    integer holds, which failed the store's query with a 500) is not found."""
    if not 0 <= block_index <= MAX_BLOCK_INDEX:
        raise NotFoundError(f"no {what} with index {block_index}")
    return block_index


# -- the API's interactive docs -------------------------------------------------------------------

@router.get("/docs")
def api_docs(request: Request) -> Response:
    """swagger-ui over /openapi.json, from the package's own copy (static/vendor) under the pages'
    content security policy: no CDN, no inline script. Open to anyone, like /openapi.json: it
    holds no data; "Authorize" takes a key, kept in the page's memory only."""
    return render(request, "docs.html", None)


# -- login ----------------------------------------------------------------------------------------

@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:
    state = server_state(request)
    if not state.auth:
        return RedirectResponse("/", status_code=303)
    try:
        principal_of(request)
        return RedirectResponse(safe_next(next), status_code=303)  # already signed in
    except AuthenticationError:
        return render(request, "login.html", None, next=safe_next(next))


@router.post("/login")
async def login(request: Request) -> Response:
    check_origin(request)  # login CSRF: no other site signs a browser in with its own key
    fields = await form_fields(request)
    next_path = safe_next(fields.get("next", "/"))
    key = fields.get("key", "").strip()
    state = server_state(request)
    if not key:
        return render(request, "login.html", None, status=401, next=next_path, error="Enter an API key.")
    client = request.client.host if request.client else "unknown"
    wait = state.login_throttle.retry_after(client, key)
    if wait > 0:  # too many failures from here or for this key: the key is not even checked
        seconds = max(1, math.ceil(wait))
        refused = render(request, "login.html", None, status=429, next=next_path,
                         error=f"Too many failed logins from here or for this key. Try again in {seconds} s.")
        refused.headers["Retry-After"] = str(seconds)
        return refused
    sessions = state.access.sessions
    assert sessions is not None
    try:
        session_id, _ = await run_in_threadpool(sessions.open, key)
    except AuthenticationError:
        state.login_throttle.failed(client, key)
        return render(request, "login.html", None, status=401, next=next_path,
                      error="That key is not valid (wrong, malformed or revoked).")
    response = RedirectResponse(next_path, status_code=303, headers=SECURITY_HEADERS)
    set_session(response, request, session_id, max_age=state.settings.server_session_max_seconds)
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    check_origin(request)
    session_id = request.cookies.get(SESSION_COOKIE)
    sessions = server_state(request).access.sessions
    if session_id and sessions is not None:
        sessions.end(session_id)  # over on the server too, not only in this browser
    response = RedirectResponse("/login", status_code=303, headers=SECURITY_HEADERS)
    clear_session(response, request)
    return response


# -- overview -------------------------------------------------------------------------------------

def _last_verify(request: Request, tenant: str) -> dict[str, Any] | None:
    results: dict[str, dict[str, Any]] = getattr(request.app.state, "gieok_verified", {})
    return results.get(tenant)


@pages.get("/")
def overview(request: Request, who: Viewer) -> Response:
    state = server_state(request)
    with state.access.tenant(who) as t:
        data = views.overview(t, state.bus, who.tenant)
    return render(request, "overview.html", who, nav="overview", verify=_last_verify(request, who.tenant), **data)


@forms.post("/verify")
def verify(request: Request, who: Editor) -> Response:
    state = server_state(request)
    with state.access.tenant(who) as t:
        started = time.perf_counter()
        report = t.memory.verify().as_dict()
    report.update(at=time.time(), seconds=time.perf_counter() - started)
    if not hasattr(request.app.state, "gieok_verified"):
        request.app.state.gieok_verified = {}
    request.app.state.gieok_verified[who.tenant] = report
    if _fragment(request, "verify"):
        return render(request, "_verify.html", who, verify=report)
    return RedirectResponse("/#verify", status_code=303, headers=SECURITY_HEADERS)


# -- search ---------------------------------------------------------------------------------------

@pages.get("/search")
def search(request: Request, who: Viewer, q: str = "", channel: str = "", guild: str = "", user: str = "",
           kind: str = "", k: int = 10, mode: str = "hybrid") -> Response:
    form = {"q": q, "channel": channel, "guild": guild, "user": user, "kind": kind, "k": k, "mode": mode}
    found: dict[str, Any] | None = None
    error = None
    if q.strip():
        try:
            if mode not in MODES:
                raise InvalidInputError(f"mode must be one of {', '.join(MODES)}")
            if kind and kind not in KINDS:
                raise InvalidInputError(f"kind must be one of {', '.join(KINDS)}")
            given = (("channel", _id(channel, "channel")), ("guild", _id(guild, "guild")), ("user", _id(user, "user")))
            scope = {name: value for name, value in given if value}
            state = server_state(request)
            with state.access.tenant(who) as t:
                found = views.search(t, q, max(1, min(MAX_K, k)), scope, kind or None, mode)
        except GieokError as exc:
            if isinstance(exc, AuthenticationError):
                raise
            error = str(exc)
    name = "_results.html" if _fragment(request, "results") else "search.html"
    return render(request, name, who, nav="search", form=form, found=found, error=error)


@pages.get("/blocks/{block_index}")
def block(request: Request, block_index: int, who: Viewer, window: int = 3) -> Response:
    _block_number(block_index)
    state = server_state(request)
    with state.access.tenant(who) as t:
        data = views.context(t, block_index, max(0, min(10, window)))
    name = "_context.html" if _fragment(request, "context") else "block.html"
    return render(request, name, who, nav="search", **data)


# -- conversations --------------------------------------------------------------------------------

@pages.get("/conversations")
def conversations(request: Request, who: Viewer, channel: str = "", guild: str = "", page: int = 0) -> Response:
    state = server_state(request)
    picked = _id(channel, "channel")
    guild_id = _id(guild, "guild")
    page = max(0, min(page, views.MAX_SCAN // views.PAGE))
    with state.access.tenant(who) as t:
        listing = views.conversations(t, page)
        chosen = views.conversation(t, guild_id, picked) if picked else None
    if _fragment(request, "conversation"):
        return render(request, "_conversation.html", who, conv=chosen)
    return render(request, "conversations.html", who, nav="conversations", conv=chosen,
                  selected={"channel": picked, "guild": guild_id}, **listing)


# -- facts ----------------------------------------------------------------------------------------

NOTICES = {"fact": "Fact #{block} forgotten.",
           "user": "User {who} forgotten: {facts} facts and {messages} messages erased.",
           "erased": "User {who} erased: {facts} facts, {messages} messages, {l1_rows} recent lines, "
                     "{summary_items} summary items and {names} names."}
COUNTS = ("block", "facts", "messages", "l1_rows", "summary_items", "names")  # a notice's numbers
RECEIPT = COUNTS[1:]  # an erasure's receipt, as the Users page reports it


def _notice(request: Request) -> str | None:
    params = request.query_params
    template = NOTICES.get(params.get("done", ""))
    if template is None:
        return None
    try:
        # `who`, not `user`: the Facts page's filter is `user`, and the notice's person would filter it
        return template.format(who=params.get("who", "")[:100], **{name: int(params.get(name, "0"))
                                                                      for name in COUNTS})
    except ValueError:
        return None


@pages.get("/facts")
def facts(request: Request, who: Viewer, user: str = "", guild: str = "", history: bool = True,
          page: int = 0) -> Response:
    state = server_state(request)
    user_id, guild_id = _id(user, "user"), (guild.strip() or None)
    page = max(0, min(page, views.MAX_SCAN // views.PAGE))
    with state.access.tenant(who) as t:
        data = views.facts(t, user=user_id, guild=guild_id, history=history, page=page)
    here = "/facts?" + urlencode({"user": user_id or "", "guild": guild_id or "", "history": int(history),
                                  "page": page})
    return render(request, "facts.html", who, nav="facts", filters={"user": user_id or "", "guild": guild_id or "",
                                                                      "history": history},
                  here=here, notice=_notice(request), **data)


def _back_to_facts(fields: dict[str, str], **notice: Any) -> Response:
    back = safe_next(fields.get("back", "/facts"))
    if not back.startswith("/facts"):
        back = "/facts"
    path, _, query = back.partition("?")
    params = {k: v[-1] for k, v in parse_qs(query).items() if k in ("user", "guild", "history", "page")}
    return RedirectResponse(f"{path}?{urlencode({**params, **notice})}", status_code=303, headers=SECURITY_HEADERS)


@forms.post("/facts/forget")
def forget_fact(request: Request, who: Editor, fields: Form) -> Response:
    index = _block_number(_int(fields.get("block_index"), "block_index"), "fact")
    state = server_state(request)
    with state.access.tenant(who) as t:
        if index not in t.conversation.tables.facts_get([index]):
            raise NotFoundError(f"no fact with index {index}")
        t.memory.forget([index])
    return _back_to_facts(fields, done="fact", block=index)


@forms.post("/facts/forget-user")
def forget_user(request: Request, who: Editor, fields: Form) -> Response:
    who.require("admin")  # erasing a person is an admin's on every page (the Users page says why)
    user_id = str(check_id(fields.get("user_id", "").strip(), "user"))
    state = server_state(request)
    with state.access.tenant(who) as t:
        _known_user(t, user_id)
        erased = t.conversation.forget_user(user_id)
    return _back_to_facts(fields, done="user", who=user_id, facts=erased["facts"], messages=erased["messages"])


@pages.get("/facts/{block_index}/source")
def fact_source(request: Request, block_index: int, who: Viewer) -> Response:
    _block_number(block_index, "fact")
    state = server_state(request)
    with state.access.tenant(who) as t:
        found = views.find_source(t, block_index)
    if found is None:
        raise NotFoundError(f"the message fact #{block_index} came from is no longer stored (forgotten, or never "
                            "written as a turn)")
    return RedirectResponse(f"/blocks/{found}", status_code=303, headers=SECURITY_HEADERS)


# -- users ----------------------------------------------------------------------------------------

def _user(value: str) -> str:
    return str(check_id(value.strip(), "user"))


@pages.get("/users")
def users(request: Request, who: Viewer, after: str = "") -> Response:
    state = server_state(request)
    start = _id(after, "after")
    with state.access.tenant(who) as t:
        data = views.users(t, start)
        zone = t.conversation.settings.timezone  # the tenant's own (tenant_timezones)
    return render(request, "users.html", who, nav="users", notice=_notice(request), zone=zone, **data)


def _user_page(request: Request, who: Principal, user_id: str, page: int, *, status: int = 200,
               **extra: Any) -> Response:
    state = server_state(request)
    with state.access.tenant(who) as t:
        data = views.user(t, user_id, max(0, min(page, views.MAX_SCAN // views.PAGE)))
        zone = t.conversation.settings.timezone
    return render(request, "user.html", who, nav="users", status=status, zone=zone, **data, **extra)


@pages.get("/users/{user}")
def user_page(request: Request, user: str, who: Viewer, page: int = 0) -> Response:
    return _user_page(request, who, _user(user), page)


@pages.get("/users/{user}/data")
def user_data(request: Request, user: str, who: Viewer) -> Response:
    """Everything held about the user (an access request, `ConversationMemory.user_data`) as a
    JSON download, streamed as it is read: an admin's, as `GET /v1/users/{user}` is."""
    who.require("admin")
    user_id = _user(user)
    state = server_state(request)
    with state.access.tenant(who) as t:
        if views.user_row(t, user_id) is None and not t.conversation.facts.facts(user_id=user_id, limit=1):
            raise NotFoundError(f"no user {user_id!r} in this memory")

    def parts() -> Iterator[str]:  # the tenant stays open while the stream runs
        with state.access.tenant(who) as t:
            yield from t.conversation.user_data(user_id)

    name = f"gieok-user-{user_id}.json"
    disposition = f"attachment; filename=\"gieok-user.json\"; filename*=UTF-8''{quote(name, safe='')}"
    return StreamingResponse(parts(), media_type="application/json",
                             headers={**SECURITY_HEADERS, "Content-Disposition": disposition})


@forms.post("/users/{user}/erase")
def erase_user(request: Request, user: str, who: Editor, fields: Form) -> Response:
    """Erase a user (`ConversationMemory.forget_user`): an admin's, confirmed by typing the
    user's id again; then the Users page shows the receipt's counts."""
    who.require("admin")
    user_id = _user(user)
    if fields.get("confirm", "").strip() != user_id:
        return _user_page(request, who, user_id, 0, status=400,
                          erase_error=f"Type the user id {user_id} to confirm the erasure. Nothing was erased.")
    state = server_state(request)
    with state.access.tenant(who) as t:
        _known_user(t, user_id)
        pipeline = t._pipeline
        if pipeline is not None:  # a background extraction could write a fact of theirs back
            from_thread.run(pipeline.drain)
        author = f"key:{who.key_prefix}" if who.key_prefix else "local"
        receipt = t.conversation.forget_user(user_id, reason=f"dashboard, {author}")
    counts = {name: int(receipt.get(name, 0)) for name in RECEIPT}
    return RedirectResponse(f"/users?{urlencode({'done': 'erased', 'who': user_id, **counts})}", status_code=303,
                            headers=SECURITY_HEADERS)


def _known_user(t: Tenant, user_id: str) -> None:
    """Not found: a user this memory holds nothing of (an erasure of them would report one)."""
    if views.user_row(t, user_id) is None and not t.conversation.facts.facts(user_id=user_id, limit=1):
        raise NotFoundError(f"no user {user_id!r} in this memory")


# -- live -----------------------------------------------------------------------------------------

@pages.get("/live")
def live(request: Request, who: Viewer) -> Response:
    state = server_state(request)
    with state.access.tenant(who) as t:
        health = views.health(t, state.bot)
    since = max(0, state.bus.last_seq(who.tenant) - LIVE_BACKLOG)
    return render(request, "live.html", who, nav="live", since=since, **health)


@pages.get("/live/health")
def live_health(request: Request, who: Viewer) -> Response:
    state = server_state(request)
    with state.access.tenant(who) as t:
        health = views.health(t, state.bot)
    return render(request, "_health.html", who, **health)

"""The web dashboard of `gieok serve`: the memory's layers as pages a person reads in a
browser — overview, search playground, conversations, facts, and the live event stream —
server-rendered (Jinja2) with small vendored scripts (htmx, uPlot) and no build step.
Same process, same API keys and tenant checks as the REST API (routes.py, security.py)."""

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from .routes import ROUTERS, STATIC_DIR, TEMPLATES_DIR

__all__ = ["install", "ROUTERS", "STATIC_DIR", "TEMPLATES_DIR"]


def install(app: FastAPI) -> None:
    """Serve the dashboard from `app`: its pages at / and its static files at /static."""
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.state.gieok_verified = {}  # tenant -> its last verify report (this process)

"""The viewer's web app: FastAPI routes rendering Jinja2 templates (autoescaped) over a
:class:`~spasm.viewer.queries.RunIndex` and an :class:`~spasm.viewer.annotations.AnnotationBook`.

Routes (every one read-only except ``POST /api/labels``)::

    /                         run overview
    /dialogues                the list: filters, search, sort, paging
    /d/{id}                   one dialogue; /d/{id}/seen/{i}: what the speaker of turn i saw
    /compare/{id}             the same persona, conversation and seed under every condition/level
    /api/labels[/{id}]        labels of a dialogue (GET) and a new label (POST, JSON)
    /eval/report.html         the report of `spasm eval` (sandboxed)
    /static/{viewer.css,viewer.js}

No route takes a file name: dialogue ids are looked up as query parameters of DuckDB, and the
only files served are the two static files and the eval report, by fixed names.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from spasm.errors import UserError
from spasm.viewer import routes
from spasm.viewer.security import LOOPBACK_HOSTS, Guard
from spasm.viewer.state import NotFound, ViewerState

__all__ = ["Extension", "create_app"]


#: Adds pages to the viewer's app (``spasm view``'s play pages, :mod:`spasm.play.web`): called
#: with the app and its state before the viewer's own routes, behind the same guard.
Extension = Callable[[FastAPI, ViewerState], None]


def create_app(run_dir: str | Path, *, token: str | None = None, loopback: bool = True,
               extend: Extension | None = None) -> FastAPI:
    """The app for ``run_dir``. ``loopback``: serve only ``Host: 127.0.0.1/localhost``;
    ``token``: every request must carry it (required when not ``loopback``); ``extend``: more
    pages (the play pages), behind the same guard."""
    if not loopback and not token:
        raise UserError("A viewer reachable from other machines needs a token (--token).")
    viewer = ViewerState(run_dir)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        viewer.close()

    app = FastAPI(title="spasm view", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.viewer = viewer
    app.middleware("http")(Guard(token, LOOPBACK_HOSTS if loopback else None))

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: NotFound) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": str(exc)}, status_code=404)
        return viewer.render("error.html", 404, title="Not found", message=str(exc))

    @app.exception_handler(UserError)
    async def _bad_request(request: Request, exc: UserError) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": str(exc)}, status_code=400)
        return viewer.render("error.html", 400, title="Bad request", message=str(exc))

    @app.exception_handler(404)
    async def _no_route(request: Request, exc: Exception) -> Response:
        return viewer.render("error.html", 404, title="Not found", message="No such page.")

    if extend is not None:
        extend(app, viewer)
    routes.add_routes(app, viewer)
    return app


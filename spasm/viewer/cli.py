"""The ``view`` sub-command (wired in by ``spasm/cli.py`` through :func:`register`)."""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import threading
import webbrowser
from pathlib import Path
from typing import Any

from spasm.errors import UserError

__all__ = ["cmd_view", "register", "resolve_token"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``view`` to the main parser."""
    p = subparsers.add_parser(
        "view",
        help="browse, compare and annotate a run in the browser",
        description="Serve a local web viewer of RUN_DIR: overview, dialogue list, each dialogue "
        "with what every agent saw, ECP vs CONCAT side by side, harness state, and labelling. "
        "Binds 127.0.0.1; any other --host needs a token (one is generated when not given).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="run directory (runs/<name>)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free port)")
    p.add_argument("--token", help="require this token on every request (default: none on "
                   "127.0.0.1, a random one on any other host)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.set_defaults(func=cmd_view)


def resolve_token(host: str, token: str | None) -> str | None:
    """The token the server requires: the one given, or a fresh one for a non-loopback bind."""
    from spasm.viewer.security import is_loopback

    if token is not None:
        if len(token) < 8:
            raise UserError("--token must be at least 8 characters.")
        return token
    return None if is_loopback(host) else secrets.token_urlsafe(18)


def cmd_view(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C."""
    try:
        import duckdb  # noqa: F401
        import fastapi  # noqa: F401
        import jinja2  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise UserError(f"The viewer needs the 'view' extra ({exc.name} is missing): "
                        "pip install 'spasm[view]'.") from None
    from spasm.viewer.server import ViewerServer

    if not 0 <= args.port <= 65535:
        raise UserError("--port must be between 0 and 65535.")
    token = resolve_token(args.host, args.token)
    server = ViewerServer(args.run_dir, host=args.host, port=args.port, token=token,
                          extend=getattr(args, "extend_app", None))
    print(f"spasm view: {args.run_dir} at {server.url}", flush=True)
    if token is not None and args.token is None:
        print("(a token was generated because the viewer is reachable from other machines; "
              "every request must carry it)", file=sys.stderr)
    print("Press Ctrl-C to stop.", file=sys.stderr, flush=True)
    if not args.no_browser:
        threading.Timer(0.8, webbrowser.open, args=(server.url,)).start()
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0

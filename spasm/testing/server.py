"""A small OpenAI-compatible HTTP server for tests and benchmarks.

It speaks just enough of the OpenAI REST API for the ``openai`` SDK to talk to it
(``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``GET /v1/models``), answers
deterministically, and can add latency and inject faults (429, 500, dropped connections,
hangs, malformed bodies, empty completions, answers trickled a byte at a time) drawn from a
seeded RNG, keep a provider's rate limits (``limit_rps``, ``limit_tps``: 429s with
``Retry-After`` and the ``x-ratelimit-*`` headers, :mod:`spasm.testing.ratelimit`), and refuse
structured-output formats the way real servers do (``reject_formats``)::

    with TestServer(FaultPlan(latency_s=0.2, rate_429=0.1, seed=1)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test")
        ...
        print(server.stats)

Like llama.cpp's server it honours ``response_format`` ``json_object`` with a ``schema`` field
(the reply is an instance of the schema). ``TestServer(reject_formats={"json_schema"})`` answers
json_schema requests with HTTP 500 and a validation message like llama-cpp-python's server
(``"json_object"`` refuses json_object; ``"schema_field"`` refuses only json_object with a
``schema`` field, as an API that takes json_object but no schema might).

Run it by hand with ``python -m spasm.testing.server --port 8765 --latency 0.2``.

Only the standard library and pydantic are used, so it starts fast and needs no extras. The
fault plan lives in :mod:`spasm.testing.faults`, the deterministic content in
:mod:`spasm.testing.replies`, the HTTP protocol side in :mod:`spasm.testing.protocol`; this
module is the server object and its command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import socket
import sys
import threading
from collections.abc import Callable, Collection, Sequence
from types import FrameType, TracebackType
from typing import Any

import pydantic

from spasm.backends.instances import instance_from_schema
from spasm.testing.faults import _MALFORMED_BODIES, FORMATS, OUTCOMES, FaultPlan
from spasm.testing.protocol import _HTTPServer, _State, limiter_for
from spasm.testing.replies import default_reply, embed
from spasm.testing.usage import Usage

__all__ = [
    "OUTCOMES",
    "FaultPlan",
    "TestServer",
    "call_first_tool",
    "default_reply",
    "embed",
    "instance_from_schema",
    "main",
]

# ---------------------------------------------------------------------------------------
# Public server
# ---------------------------------------------------------------------------------------


class TestServer:
    """An OpenAI-compatible server on loopback, run in a background thread.

    Use it as a context manager (or call :meth:`start` and :meth:`close`)::

        with TestServer(FaultPlan(rate_429=0.5)) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)

    ``reply`` maps a chat request body to the reply text, or, for a request that offers
    ``tools``, to ``{"tool_calls": [{"name", "arguments"}]}`` (the server gives each call an id
    and answers with ``finish_reason: tool_calls``, as OpenAI does); without it the server
    answers deterministically (see :func:`default_reply`). Like OpenAI's API it refuses a
    ``tool`` message that answers no call of the ``assistant`` message before it. ``models`` are listed by
    ``GET /v1/models``; requests may name any model. ``reject_formats`` names structured-output
    formats to refuse with HTTP 500 (any of :data:`FORMATS`). ``usage`` says how tokens are
    counted and whether a prefix cache reports cached tokens (:class:`~spasm.testing.usage.Usage`;
    default: words, no cache).
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        plan: FaultPlan | None = None,
        reply: Callable[[dict[str, Any]], str | dict[str, Any]] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        models: Sequence[str] = ("test-model",),
        reject_formats: Collection[str] = (),
        usage: Usage | None = None,
    ) -> None:
        unknown = set(reject_formats) - set(FORMATS)
        if unknown:
            raise ValueError(f"unknown format(s) {sorted(unknown)} in reject_formats; known: {FORMATS}")
        self._state = _State(plan or FaultPlan(), reply, models, frozenset(reject_formats), usage)
        self._host = host
        self._requested_port = port
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> TestServer:
        """Bind the socket and serve in a daemon thread; returns ``self``."""
        if self._httpd is not None:
            raise RuntimeError("the test server is already running")
        self._state.stopping.clear()
        self._httpd = _HTTPServer((self._host, self._requested_port), self._state)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"spasm-testserver-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, wake sleeping handlers and close every open connection."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._state.stopping.set()
        httpd.shutdown()
        with self._state.lock:
            connections = list(self._state.connections)
        for conn in connections:  # keep-alive connections would otherwise idle forever
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> TestServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (used by the CLI)."""
        if self._thread is None:
            self.start()
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(timeout=0.5)
        finally:
            self.close()

    # -- introspection ----------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port the server listens on (known once started)."""
        if self._httpd is None:
            raise RuntimeError("the test server is not running; use it as a context manager")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """The URL to give ``openai.OpenAI(base_url=...)``, e.g. ``http://127.0.0.1:PORT/v1``."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}/v1"

    @property
    def plan(self) -> FaultPlan:
        """The fault plan in force."""
        return self._state.plan

    def set_plan(self, plan: FaultPlan) -> None:
        """Switch to ``plan`` for the following requests and reseed the fault RNG with its seed."""
        with self._state.lock:
            self._state.plan = plan
            self._state.rng = random.Random(plan.seed)
            self._state.limiter = limiter_for(plan)

    @property
    def stats(self) -> dict[str, int]:
        """A snapshot of outcome counts: ``requests`` plus each name in :data:`OUTCOMES`."""
        with self._state.lock:
            return dict(self._state.stats)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies received (the last 10,000), oldest first; headers are never kept."""
        with self._state.lock:
            return list(self._state.requests)

    @property
    def arrivals(self) -> list[float]:
        """When each POST arrived (``time.monotonic()``, the last 10,000), oldest first."""
        with self._state.lock:
            return list(self._state.arrivals)

    @property
    def max_in_flight(self) -> int:
        """The most POSTs that were being answered at once."""
        with self._state.lock:
            return self._state.max_in_flight

    def reset(self) -> None:
        """Zero the stats and forget recorded requests (the plan and RNG are kept)."""
        with self._state.lock:
            self._state.stats = dict.fromkeys(self._state.stats, 0)
            self._state.requests.clear()
            self._state.arrivals.clear()
            self._state.max_in_flight = self._state.in_flight


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------


def call_first_tool(body: dict[str, Any]) -> str | dict[str, Any]:
    """A reply callable for runs with tools (``--call-tools``): a request that offers tools and
    does not end in a ``tool`` message calls the first tool offered, with an instance of its
    parameters' schema; every other request gets :func:`default_reply`. So each acting turn
    takes exactly one tool step (the tools benchmark)."""
    tools = body.get("tools") or []
    messages = body.get("messages") or []
    if tools and (not messages or messages[-1].get("role") != "tool"):
        fn = tools[0]["function"]
        return {"tool_calls": [{"name": fn["name"],
                                "arguments": instance_from_schema(fn.get("parameters") or {})}]}
    return default_reply(body)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spasm.testing.server",
        description="Serve an OpenAI-compatible test API with latency and injected faults.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    p.add_argument("--model", action="append", dest="models", help="model to list (repeatable)")
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    p.add_argument("--rate-429", type=float, default=0.0)
    p.add_argument("--retry-after", type=float, default=0.05, help="Retry-After seconds for 429s")
    p.add_argument("--no-retry-after", action="store_true", help="send 429s without Retry-After")
    p.add_argument("--rate-500", type=float, default=0.0)
    p.add_argument("--rate-drop", type=float, default=0.0)
    p.add_argument("--rate-hang", type=float, default=0.0)
    p.add_argument("--hang-s", type=float, default=30.0)
    p.add_argument("--rate-malformed", type=float, default=0.0)
    p.add_argument("--rate-empty", type=float, default=0.0)
    p.add_argument("--rate-trickle", type=float, default=0.0,
                   help="share of answers sent one byte every --trickle-s seconds")
    p.add_argument("--trickle-s", type=float, default=0.5)
    p.add_argument("--malformed-body", choices=sorted(_MALFORMED_BODIES), default="truncated")
    p.add_argument("--reject-format", action="append", choices=FORMATS, default=[],
                   help="refuse this structured-output format with HTTP 500 (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--call-tools", action="store_true",
                   help="a request offering tools calls the first one once per turn (call_first_tool)")
    p.add_argument("--limit-rps", type=float, default=None,
                   help="accept this many requests per second; 429 the rest (a provider's limit)")
    p.add_argument("--limit-tps", type=float, default=None,
                   help="accept this many tokens (prompt + max_tokens) per second; 429 the rest")
    p.add_argument("--limit-burst-s", type=float, default=1.0,
                   help="the limits' buckets hold this many seconds of their rate")
    p.add_argument("--no-limit-headers", action="store_true",
                   help="with a limit, send no x-ratelimit-* headers (only 429s say it)")
    return p


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run the test server until Ctrl-C; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        plan = FaultPlan(
            latency_s=args.latency,
            rate_429=args.rate_429,
            retry_after_s=None if args.no_retry_after else args.retry_after,
            rate_500=args.rate_500,
            rate_drop=args.rate_drop,
            rate_hang=args.rate_hang,
            hang_s=args.hang_s,
            rate_malformed=args.rate_malformed,
            rate_empty=args.rate_empty,
            rate_trickle=args.rate_trickle,
            trickle_s=args.trickle_s,
            malformed_body=args.malformed_body,
            seed=args.seed,
            limit_rps=args.limit_rps,
            limit_tps=args.limit_tps,
            limit_burst_s=args.limit_burst_s,
            limit_headers=not args.no_limit_headers,
        )
    except pydantic.ValidationError as exc:
        print(f"error: invalid fault plan:\n{exc}", file=sys.stderr)
        return 2
    server = TestServer(plan, call_first_tool if args.call_tools else None, host=args.host,
                        port=args.port, models=args.models or ["test-model"],
                        reject_formats=args.reject_format)
    try:
        server.start()
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    print(server.base_url, flush=True)
    # Stop cleanly (and print the stats) on SIGTERM as well as on Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        print(json.dumps(server.stats), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

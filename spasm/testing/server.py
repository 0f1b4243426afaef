"""A small OpenAI-compatible HTTP server for tests and benchmarks.

It speaks just enough of the OpenAI REST API for the ``openai`` SDK to talk to it
(``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``GET /v1/models``), answers
deterministically, and can add latency and inject faults (429, 500, dropped connections,
hangs, malformed bodies, empty completions, answers trickled a byte at a time) drawn from a
seeded RNG, and refuse structured-output formats the way real servers do (``reject_formats``)::

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

Only the standard library and pydantic are used, so it starts fast and needs no extras.
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import hashlib
import json
import math
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, Literal, cast

import pydantic

from spasm.backends.instances import instance_from_schema
from spasm.testing.usage import Usage

__all__ = [
    "OUTCOMES",
    "FaultPlan",
    "TestServer",
    "default_reply",
    "embed",
    "instance_from_schema",
    "main",
]

#: Keys of :attr:`TestServer.stats` besides ``requests``, in the order faults are drawn.
OUTCOMES: tuple[str, ...] = (
    "ok",
    "429",
    "500",
    "drop",
    "hang",
    "malformed",
    "empty",
    "bad_request",
    "trickle",
)

_MAX_RECORDED_REQUESTS = 10_000
_EMBEDDING_DIM = 64
_WORD_RE = re.compile(r"\w+", re.UNICODE)

# Bodies of a 200 "malformed" answer (FaultPlan.malformed_body), with their content type: JSON
# cut off mid-object, an HTML page (a proxy's error page), JSON that is no chat completion.
_MALFORMED_BODIES: dict[str, tuple[bytes, str]] = {
    "truncated": (
        b'{"id": "chatcmpl-malformed", "object": "chat.completion", "choices": [{"ind',
        "application/json",
    ),
    "html": (
        b"<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>",
        "text/html; charset=utf-8",
    ),
    "no_choices": (b'{"id": "chatcmpl-malformed", "object": "chat.completion"}', "application/json"),
}

#: The structured-output formats ``reject_formats`` may name.
FORMATS: tuple[str, ...] = ("json_schema", "json_object", "schema_field")


_Rate = pydantic.Field(default=0.0, ge=0.0, le=1.0)


class FaultPlan(pydantic.BaseModel, extra="forbid"):
    """What the server does to each request: latency, then at most one fault.

    For every ``POST`` to a known endpoint one number is drawn from ``random.Random(seed)``
    (under a lock) and compared against the cumulative rates in this fixed order: 429, 500,
    drop, hang, malformed, empty, trickle; otherwise the request succeeds. A run whose requests
    arrive in the same order therefore sees the same faults. Rates must sum to at most 1.
    """

    latency_s: float = pydantic.Field(default=0.0, ge=0.0)
    """Seconds to sleep before answering each request (faults included)."""
    rate_429: float = _Rate
    """Share of requests answered ``429 Too Many Requests``."""
    retry_after_s: float | None = pydantic.Field(default=0.05, ge=0.0)
    """Sent with 429s as ``Retry-After`` (seconds) and ``retry-after-ms``; ``None``: neither."""
    rate_500: float = _Rate
    """Share of requests answered ``500 Internal Server Error``."""
    rate_drop: float = _Rate
    """Share of requests whose connection is closed without any response."""
    rate_hang: float = _Rate
    """Share of requests that wait ``hang_s`` seconds, then close without a response."""
    hang_s: float = pydantic.Field(default=30.0, ge=0.0)
    """How long a hanging request waits before its connection is closed."""
    rate_malformed: float = _Rate
    """Share of requests answered 200 with a body that is not a chat completion."""
    malformed_body: Literal["truncated", "html", "no_choices"] = "truncated"
    """What a malformed answer is: JSON cut off mid-object, an HTML page (``text/html``), or
    JSON without ``choices``."""
    rate_empty: float = _Rate
    """Share of chat completions answered with content ``""``."""
    rate_trickle: float = _Rate
    """Share of requests answered correctly but slowly: the headers at once, then the body one
    byte every ``trickle_s`` seconds (each read is quick, the whole answer is not)."""
    trickle_s: float = pydantic.Field(default=0.5, ge=0.0)
    """Seconds between the bytes of a trickled answer."""
    seed: int = 0
    """Seed of the fault RNG; :meth:`TestServer.set_plan` reseeds it."""

    @pydantic.model_validator(mode="after")
    def _rates_sum_to_at_most_one(self) -> FaultPlan:
        total = sum(rate for _, rate in self.fault_rates())
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates sum to {total:g}; lower them so they sum to at most 1")
        return self

    def fault_rates(self) -> list[tuple[str, float]]:
        """The (outcome, rate) pairs in the order they are drawn."""
        return [
            ("429", self.rate_429),
            ("500", self.rate_500),
            ("drop", self.rate_drop),
            ("hang", self.rate_hang),
            ("malformed", self.rate_malformed),
            ("empty", self.rate_empty),
            ("trickle", self.rate_trickle),
        ]

    def pick(self, u: float) -> str:
        """Map a uniform draw ``u`` in [0, 1) to an outcome name (``"ok"`` when no fault)."""
        edge = 0.0
        for outcome, rate in self.fault_rates():
            edge += rate
            if u < edge:
                return outcome
        return "ok"


# ---------------------------------------------------------------------------------------
# Deterministic content
# ---------------------------------------------------------------------------------------

_TEMPLATES: tuple[str, ...] = (
    "I see. About '{words}' — could you tell me more?",
    "Interesting point on '{words}'. What makes you say that?",
    "Thanks for sharing '{words}'. How does that affect you day to day?",
    "Let me think about '{words}'. Could you give me an example?",
    "Understood: '{words}'. What would you like to happen next?",
    "Hmm, '{words}' is worth unpacking. Where would you like to start?",
)


def _text_of(content: Any) -> str:
    """The text of a message's ``content``: a string, or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def _words(text: str) -> list[str]:
    return text.split()


def _digest(*parts: object) -> int:
    data = "\x1f".join(repr(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def default_reply(body: dict[str, Any]) -> str:
    """The reply the server gives when no ``reply`` callable is configured.

    A JSON instance of the schema for ``response_format`` ``json_schema``, and for
    ``json_object`` with a ``schema`` field (as llama.cpp's server does); ``{}`` for a bare
    ``json_object``; otherwise a short sentence chosen and filled from the last message and
    ``seed``.
    """
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema") or {}
            schema = spec.get("schema") or {}
            return json.dumps(instance_from_schema(schema), ensure_ascii=False)
        if fmt.get("type") == "json_object":
            schema = fmt.get("schema")
            if isinstance(schema, dict):
                return json.dumps(instance_from_schema(schema), ensure_ascii=False)
            return "{}"
    messages = body.get("messages") or []
    last = _text_of(messages[-1].get("content")) if messages else ""
    words = " ".join(_words(last)[:6])
    template = _TEMPLATES[_digest(last, body.get("seed")) % len(_TEMPLATES)]
    return template.format(words=words)


def embed(text: str, dimensions: int = _EMBEDDING_DIM) -> list[float]:
    """A deterministic bag-of-words embedding, L2-normalised (all zeros for no words).

    Each lowercase word token is hashed to a bucket and a sign (the hashing trick), so the
    same text always gives the same vector and texts sharing no words are near-orthogonal.
    """
    vector = [0.0] * dimensions
    for token in _WORD_RE.findall(text.lower()):
        h = _digest("tok", token)
        vector[h % dimensions] += 1.0 if (h >> 32) & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector


# ---------------------------------------------------------------------------------------
# HTTP plumbing
# ---------------------------------------------------------------------------------------


#: The prompt of spasm's preflight chat call (spasm.backends.openai_compat).
PREFLIGHT_PROMPT = "spasm preflight: reply with one word."
_PREFLIGHT_REPLY = json.dumps({
    "id": "chatcmpl-preflight", "object": "chat.completion", "created": 0, "model": "preflight",
    "choices": [{"index": 0, "finish_reason": "length",
                 "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
}).encode()


def _is_preflight(raw: bytes) -> bool:
    if PREFLIGHT_PROMPT.encode() not in raw:
        return False
    try:
        body = json.loads(raw)
        return bool(body["messages"][-1]["content"] == PREFLIGHT_PROMPT)
    except (ValueError, KeyError, IndexError, TypeError):
        return False


class _HTTPError(Exception):
    """An OpenAI-style error response the handler should send."""

    def __init__(self, status: int, message: str, kind: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code


def _error_body(message: str, kind: str, code: str | None, param: str | None = None) -> bytes:
    error = {"message": message, "type": kind, "param": param, "code": code}
    return json.dumps({"error": error}).encode()


class _State:
    """Everything the handler threads share, guarded by one lock."""

    def __init__(
        self,
        plan: FaultPlan,
        reply: Callable[[dict[str, Any]], str] | None,
        models: Sequence[str],
        reject_formats: frozenset[str] = frozenset(),
        usage: Usage | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self.usage = usage or Usage()
        self.plan = plan
        self.reject_formats = reject_formats
        self.rng = random.Random(plan.seed)
        self.reply = reply
        self.models = tuple(models)
        self.stats: dict[str, int] = dict.fromkeys(("requests", *OUTCOMES), 0)
        self.requests: collections.deque[dict[str, Any]] = collections.deque(maxlen=_MAX_RECORDED_REQUESTS)
        self.counter = 0
        self.stopping = threading.Event()
        self.connections: set[socket.socket] = set()
        # POSTs being answered now, the most at once, and when each arrived (monotonic).
        self.in_flight = 0
        self.max_in_flight = 0
        self.arrivals: collections.deque[float] = collections.deque(maxlen=_MAX_RECORDED_REQUESTS)

    def count(self, outcome: str) -> None:
        with self.lock:
            self.stats[outcome] = self.stats.get(outcome, 0) + 1

    def next_id(self) -> int:
        with self.lock:
            self.counter += 1
            return self.counter


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.state = state
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up mid-request (timeouts, dropped pools) are expected; stay quiet.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    # Without TCP_NODELAY, delayed ACKs add ~40 ms to every response.
    disable_nagle_algorithm = True
    # HTTP/1.1 + Content-Length lets the SDK's httpx pool keep connections alive.
    protocol_version = "HTTP/1.1"
    server_version = "spasm-testserver/1"
    sys_version = ""

    @property
    def state(self) -> _State:
        return cast(_HTTPServer, self.server).state

    # -- lifecycle --------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        with self.state.lock:
            self.state.connections.add(self.connection)

    def finish(self) -> None:
        with self.state.lock:
            self.state.connections.discard(self.connection)
        with contextlib.suppress(OSError):  # the client may already have hung up
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: tests and benchmarks do not want a line per request."""

    # -- responses --------------------------------------------------------------------

    def _send(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        """Send status line, headers and body in a single write (one TCP segment if small)."""
        self.wfile.write(self._head(status, len(body), headers, content_type) + body)

    def _head(
        self, status: int, length: int, headers: dict[str, str] | None, content_type: str
    ) -> bytes:
        phrase = HTTPStatus(status).phrase
        lines = [
            f"{self.protocol_version} {status} {phrase}",
            f"Server: {self.version_string()}",
            f"Date: {self.date_time_string()}",
            f"Content-Type: {content_type}",
            f"Content-Length: {length}",
        ]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if self.close_connection:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    # -- request handling --------------------------------------------------------------

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                raise _HTTPError(411, "send a Content-Length header", "invalid_request_error")
            return b""
        return self.rfile.read(int(length))

    def _pause(self, seconds: float) -> None:
        if seconds > 0:
            self.state.stopping.wait(seconds)

    def _respond(
        self,
        outcome: str,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        # Count before writing, so a client that has its answer also sees it in the stats.
        self._answered()
        self.state.count(outcome)
        self._send(status, body, headers, content_type)

    def do_GET(self) -> None:
        """Serve ``GET /v1/models``; anything else is a 404."""
        state = self.state
        state.count("requests")
        self._pause(state.plan.latency_s)
        path = self.path.split("?", 1)[0].rstrip("/")
        owner = "spasm-testserver"
        payload: dict[str, Any]
        if path == "/v1/models":
            data = [
                {"id": m, "object": "model", "created": 1_700_000_000, "owned_by": owner}
                for m in state.models
            ]
            payload = {"object": "list", "data": data}
        elif path.startswith("/v1/models/"):
            model = path.removeprefix("/v1/models/")
            payload = {"id": model, "object": "model", "created": 1_700_000_000, "owned_by": owner}
        else:
            self._not_found()
            return
        self._respond("ok", 200, json.dumps(payload).encode())

    def _not_found(self) -> None:
        message = f"unknown endpoint {self.command} {self.path}"
        self._respond("bad_request", 404, _error_body(message, "invalid_request_error", "unknown_url"))

    _in_flight = False

    def _answered(self) -> None:
        """This POST is no longer in flight (called before its answer is written, so a client
        that starts its next request on having the answer is never counted twice)."""
        if self._in_flight:
            self._in_flight = False
            with self.state.lock:
                self.state.in_flight -= 1

    def do_POST(self) -> None:
        """Serve a POST, counted in flight until it is answered (``TestServer.max_in_flight``)."""
        state = self.state
        with state.lock:
            state.arrivals.append(time.monotonic())
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
        self._in_flight = True
        try:
            self._post()
        finally:
            self._answered()

    def _post(self) -> None:
        """Serve chat completions and embeddings, applying latency and the fault plan."""
        state = self.state
        try:
            raw = self._read_body()
        except _HTTPError as err:
            state.count("requests")
            self._respond("bad_request", err.status, _error_body(err.message, err.kind, err.code))
            return
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/chat/completions" and _is_preflight(raw):
            # spasm's start-up check (one 1-token chat call): answered like a health check,
            # outside ``requests`` and the fault sequence (stats count it as "preflight"), so
            # tests count model work only.
            self._respond("preflight", 200, _PREFLIGHT_REPLY)
            return
        state.count("requests")
        routes = {"/v1/chat/completions": self._chat, "/v1/embeddings": self._embeddings}
        route = routes.get(path)
        with state.lock:
            plan = state.plan
            # One draw per request to a real endpoint, so 404s do not shift the sequence.
            outcome = plan.pick(state.rng.random()) if route is not None else "ok"
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if isinstance(body, dict):
            with state.lock:
                state.requests.append(body)

        self._pause(plan.latency_s)
        if route is None:
            self._not_found()
        elif outcome == "429":
            headers: dict[str, str] = {}
            if plan.retry_after_s is not None:
                headers["Retry-After"] = f"{plan.retry_after_s:g}"
                headers["retry-after-ms"] = str(round(plan.retry_after_s * 1000))
            message = "Rate limit reached (injected by the spasm test server)."
            error = _error_body(message, "requests", "rate_limit_exceeded")
            self._respond("429", 429, error, headers)
        elif outcome == "500":
            message = "The server had an error (injected by the spasm test server)."
            self._respond("500", 500, _error_body(message, "server_error", None))
        elif outcome in ("drop", "hang"):
            state.count(outcome)
            if outcome == "hang":
                self._pause(plan.hang_s)
            self.close_connection = True  # the socket is closed without a byte written
        elif outcome == "malformed":
            malformed, content_type = _MALFORMED_BODIES[plan.malformed_body]
            self._respond("malformed", 200, malformed, content_type=content_type)
        else:
            trickle = outcome == "trickle"
            try:
                if not isinstance(body, dict):
                    message = "the request body must be a JSON object"
                    raise _HTTPError(400, message, "invalid_request_error")
                outcome, payload = route(body, empty=outcome == "empty")
            except _HTTPError as err:
                outcome = "bad_request" if err.status < 500 else "500"
                self._respond(outcome, err.status, _error_body(err.message, err.kind, err.code))
                return
            answer = json.dumps(payload, ensure_ascii=False).encode()
            if trickle:
                self._trickle(answer, plan.trickle_s)
            else:
                self._respond(outcome, 200, answer)

    def _trickle(self, body: bytes, interval: float) -> None:
        """Send a 200 with ``body`` one byte every ``interval`` seconds (stops when closed)."""
        self._answered()
        self.state.count("trickle")
        self.wfile.write(self._head(200, len(body), None, "application/json"))
        for i in range(len(body)):
            self._pause(interval)
            if self.state.stopping.is_set():
                self.close_connection = True  # a partial answer: the connection goes too
                return
            self.wfile.write(body[i:i + 1])

    def _chat(self, body: dict[str, Any], *, empty: bool) -> tuple[str, dict[str, Any]]:
        state = self.state
        model = body.get("model")
        messages = body.get("messages")
        if not isinstance(model, str) or not model:
            raise _HTTPError(400, "you must provide a model parameter", "invalid_request_error")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise _HTTPError(400, "'messages' must be a list of message objects", "invalid_request_error")
        if body.get("stream"):
            raise _HTTPError(
                400,
                "stream=true is not supported by the spasm test server; omit it",
                "invalid_request_error",
                "unsupported_parameter",
            )
        self._check_format(body.get("response_format"))
        if empty:
            content = ""
        elif state.reply is not None:
            try:
                content = state.reply(body)
            except Exception as exc:  # the user's callable failed: report it as a 500
                raise _HTTPError(500, f"reply callable raised {exc!r}", "server_error") from exc
        else:
            try:
                content = default_reply(body)
            except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
                message = f"cannot build a reply for this request's response_format: {exc!r}"
                raise _HTTPError(400, message, "invalid_request_error") from exc

        finish_reason = "stop"
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        usage = state.usage
        if isinstance(limit, int) and usage.count(content) > limit:
            content = usage.truncate(content, limit)
            finish_reason = "length"
        completion_tokens = usage.count(content)
        prompt = [(str(m.get("role")), _text_of(m.get("content"))) for m in messages]
        prompt_tokens = usage.prompt_tokens(prompt)
        cached = usage.cached_tokens(prompt)

        n = body.get("n") or 1
        choice_count = n if isinstance(n, int) and 1 <= n <= 128 else 1
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            for i in range(choice_count)
        ]
        payload = {
            "id": f"chatcmpl-testserver-{state.next_id():08d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": f"{model}-testserver",
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens * choice_count,
                "total_tokens": prompt_tokens + completion_tokens * choice_count,
                **({"prompt_tokens_details": {"cached_tokens": cached}} if usage.prefix_cache else {}),
            },
            "system_fingerprint": "fp_spasm_testserver",
        }
        return ("empty" if empty else "ok"), payload

    def _check_format(self, fmt: Any) -> None:
        """Refuse a ``response_format`` named in ``reject_formats``, as llama-cpp-python's
        server refuses json_schema: HTTP 500 with its pydantic validation message."""
        rejected = self.state.reject_formats
        if not rejected or not isinstance(fmt, dict):
            return
        kind = fmt.get("type")
        refused = kind in rejected or (
            kind == "json_object" and "schema" in fmt and "schema_field" in rejected
        )
        if not refused:
            return
        if kind == "json_object" and kind not in rejected:
            message = (
                "1 validation error:\n  {'type': 'extra_forbidden', 'loc': ('body', "
                "'response_format', 'schema'), 'msg': 'Extra inputs are not permitted'}"
            )
        else:
            allowed = " or ".join(f"'{k}'" for k in ("text", "json_schema", "json_object")
                                  if k not in rejected)
            message = (
                "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', "
                f"'response_format', 'type'), 'msg': \"Input should be {allowed}\", "
                f"'input': '{kind}'}}"
            )
        raise _HTTPError(500, message, "internal_server_error")

    def _embeddings(self, body: dict[str, Any], *, empty: bool) -> tuple[str, dict[str, Any]]:
        del empty  # an "empty" draw has no meaning for embeddings: answer normally
        model = body.get("model")
        raw_input = body.get("input")
        if not isinstance(model, str) or not model:
            raise _HTTPError(400, "you must provide a model parameter", "invalid_request_error")
        if isinstance(raw_input, str):
            texts = [raw_input]
        elif isinstance(raw_input, list) and all(isinstance(t, str) for t in raw_input):
            texts = cast(list[str], raw_input)
        else:
            raise _HTTPError(400, "'input' must be a string or a list of strings", "invalid_request_error")
        dims = body.get("dimensions") or _EMBEDDING_DIM
        if not isinstance(dims, int) or not 1 <= dims <= 4096:
            raise _HTTPError(400, "'dimensions' must be an integer in 1..4096", "invalid_request_error")
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(texts):
            vector = embed(text, dims)
            encoded: Any = (
                base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode() if as_base64 else vector
            )
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(len(_words(t)) for t in texts)
        payload = {
            "object": "list",
            "data": data,
            "model": f"{model}-testserver",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return "ok", payload


# ---------------------------------------------------------------------------------------
# Public server
# ---------------------------------------------------------------------------------------


class TestServer:
    """An OpenAI-compatible server on loopback, run in a background thread.

    Use it as a context manager (or call :meth:`start` and :meth:`close`)::

        with TestServer(FaultPlan(rate_429=0.5)) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)

    ``reply`` maps a chat request body to the reply text; without it the server answers
    deterministically (see :func:`default_reply`). ``models`` are listed by
    ``GET /v1/models``; requests may name any model. ``reject_formats`` names structured-output
    formats to refuse with HTTP 500 (any of :data:`FORMATS`). ``usage`` says how tokens are
    counted and whether a prefix cache reports cached tokens (:class:`~spasm.testing.usage.Usage`;
    default: words, no cache).
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        plan: FaultPlan | None = None,
        reply: Callable[[dict[str, Any]], str] | None = None,
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
        )
    except pydantic.ValidationError as exc:
        print(f"error: invalid fault plan:\n{exc}", file=sys.stderr)
        return 2
    server = TestServer(plan, host=args.host, port=args.port, models=args.models or ["test-model"],
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

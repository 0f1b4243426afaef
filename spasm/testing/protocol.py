"""The test server's HTTP side: the OpenAI protocol (chat completions, embeddings, models),
its errors and the faults of a :class:`~spasm.testing.faults.FaultPlan`, one request at a time."""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import math
import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from spasm.testing.faults import _MALFORMED_BODIES, OUTCOMES, FaultPlan
from spasm.testing.ratelimit import Limiter
from spasm.testing.replies import (
    _EMBEDDING_DIM,
    _PREFLIGHT_REPLY,
    _is_preflight,
    _text_of,
    _words,
    default_reply,
    embed,
)
from spasm.testing.usage import Usage

_MAX_RECORDED_REQUESTS = 10_000


def limiter_for(plan: FaultPlan) -> Limiter:
    """The server-side rate limits of ``plan`` (inactive without ``limit_rps``/``limit_tps``)."""
    return Limiter(plan.limit_rps, plan.limit_tps, plan.limit_burst_s, plan.limit_headers)


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
        reply: Callable[[dict[str, Any]], str | dict[str, Any]] | None,
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
        self.limiter = limiter_for(plan)

    def count(self, outcome: str) -> None:
        with self.lock:
            self.stats[outcome] = self.stats.get(outcome, 0) + 1

    def next_id(self) -> int:
        with self.lock:
            self.counter += 1
            return self.counter


def _scripted(reply: Any, body: dict[str, Any], state: _State) -> tuple[str, list[dict[str, Any]] | None]:
    """A reply callable's answer: text, or ``{"tool_calls": [{"name", "arguments"}],
    "content": …}`` for a request that offered tools (each call gets an id ``call_<n>``; the
    arguments may be a mapping or JSON text)."""
    if isinstance(reply, str):
        return reply, None
    if not isinstance(reply, dict) or not isinstance(reply.get("tool_calls"), list):
        raise _HTTPError(500, f"reply callable returned {reply!r}: a str or a mapping with "
                         "tool_calls", "server_error")
    offered = {t.get("function", {}).get("name") for t in body.get("tools") or []
               if isinstance(t, dict)}
    calls = []
    for c in reply["tool_calls"]:
        name = c.get("name")
        if name not in offered:  # a real model can do this too; the test server refuses to
            raise _HTTPError(500, f"reply callable called {name!r}, which the request did not "
                             f"offer ({sorted(n for n in offered if n)})", "server_error")
        arguments = c.get("arguments", {})
        calls.append({"id": c.get("id") or f"call_{state.next_id():06d}", "type": "function",
                      "function": {"name": name, "arguments": arguments if isinstance(
                          arguments, str) else json.dumps(arguments)}})
    return str(reply.get("content") or ""), calls


def _check_tools(body: dict[str, Any]) -> None:
    """Refuse what OpenAI's API refuses about tools: ``tools`` not a list of functions, and a
    ``tool`` message that answers no call of the ``assistant`` message before it."""
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function"
            and isinstance(t.get("function"), dict) and t["function"].get("name")
            for t in tools)):
        raise _HTTPError(400, "'tools' must be a list of {type: function, function: {name, "
                         "parameters}}", "invalid_request_error")
    open_ids: set[str] = set()
    for i, m in enumerate(body.get("messages") or []):
        if m.get("role") == "assistant" and m.get("tool_calls"):
            open_ids = {str(c.get("id")) for c in m["tool_calls"] if isinstance(c, dict)}
            for c in m["tool_calls"]:
                try:
                    json.loads(c["function"]["arguments"])
                except (KeyError, TypeError, ValueError):
                    raise _HTTPError(400, f"messages[{i}].tool_calls: arguments are JSON text",
                                     "invalid_request_error") from None
        elif m.get("role") == "tool":
            if m.get("tool_call_id") not in open_ids:
                raise _HTTPError(400, f"messages[{i}]: messages with role 'tool' must be a "
                                 "response to a preceding message with 'tool_calls'",
                                 "invalid_request_error")
        else:
            open_ids = set()


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
        lines += [f"{name}: {value}" for name, value in {**self._rate, **(headers or {})}.items()]
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
    #: The rate-limit headers of the request being answered (FaultPlan.limit_*), sent with
    #: whatever the answer is.
    _rate: dict[str, str] = {}  # noqa: RUF012 (replaced per request, never mutated)

    def _charge(self, body: Any) -> float:
        """The tokens a request is charged on arrival: its prompt tokens by the server's count
        plus its ``max_tokens`` (chat), or its input's words (embeddings)."""
        if not isinstance(body, dict):
            return 0.0
        messages = body.get("messages")
        if isinstance(messages, list):
            prompt = [(str(m.get("role")), _text_of(m.get("content")))
                      for m in messages if isinstance(m, dict)]
            limit = body.get("max_completion_tokens", body.get("max_tokens"))
            return float(self.state.usage.prompt_tokens(prompt)) + (
                limit if isinstance(limit, int) and limit > 0 else 0)
        raw = body.get("input")
        texts = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
        return float(sum(len(_words(t)) for t in texts if isinstance(t, str)))

    def _rate_limited(self, wait: float, kind: str, headers: dict[str, str]) -> None:
        """Refuse a request over the server's rate limit (stats ``limited``), as OpenAI does."""
        self._rate = {}
        message = (f"Rate limit reached on {kind} per second (test server limit). Please try "
                   f"again in {wait * 1000:.0f}ms.")
        retry = {"retry-after": str(max(1, math.ceil(wait))),
                 "retry-after-ms": str(max(1, math.ceil(wait * 1000)))}
        self._respond("limited", 429, _error_body(message, kind, "rate_limit_exceeded"),
                      {**headers, **retry})

    def _answered(self) -> None:
        """This POST is no longer in flight (called before its answer is written, so a client
        that starts its next request on having the answer is never counted twice)."""
        if self._in_flight:
            self._in_flight = False
            with self.state.lock:
                self.state.in_flight -= 1

    def do_POST(self) -> None:
        """Serve a POST, counted in flight until it is answered (``TestServer.max_in_flight``)."""
        self._rate = {}
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

        limiter = state.limiter
        headers: dict[str, str] = {}
        if limiter.active and route is not None:
            wait, kind, headers = limiter.admit(self._charge(body))
            if wait is not None:  # refused at once, before any work: a provider's limit
                self._rate_limited(wait, str(kind), headers)
                return
        self._rate = headers  # the x-ratelimit headers of every answer to this request
        self._pause(plan.latency_s)
        if route is None:
            self._not_found()
        elif outcome == "429":
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
        _check_tools(body)
        calls: list[dict[str, Any]] | None = None
        if empty:
            content = ""
        elif state.reply is not None:
            try:
                scripted = state.reply(body)
            except Exception as exc:  # the user's callable failed: report it as a 500
                raise _HTTPError(500, f"reply callable raised {exc!r}", "server_error") from exc
            content, calls = _scripted(scripted, body, state)
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
        answer: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            answer = {**answer, "content": content or None, "tool_calls": calls}
            finish_reason = "tool_calls"
        choices = [
            {
                "index": i,
                "message": answer,
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



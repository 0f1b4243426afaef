"""Any OpenAI-compatible endpoint through ``openai.AsyncOpenAI``.

The SDK's own retries are switched off (``max_retries=0``): spasm has one retry policy, in
:mod:`spasm.calls`, so retries are never stacked and every attempt appears in the call log.
SDK exceptions are mapped by type and status to :mod:`spasm.errors` classes, never by message.
Embeddings requests (:meth:`OpenAIBackend.embed`, ``POST /embeddings``) are mapped the same way.

Structured requests are sent in the backend's structured-output mode
(:mod:`spasm.backends.structured`). With ``auto`` the first structured call finds the strictest
mode the server takes: a rejection steps down a rung and the same request is sent again, so the
step-down costs no logical call; the mode is then kept for the run (:attr:`structured_mode`).
A pinned mode the server rejects raises :class:`~spasm.errors.StructuredOutputRejectedError`.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import ssl
import time
from typing import Any

import anyio
import openai
from openai.types.chat import ChatCompletion

from spasm.backends.base import (
    Backend,
    ChatRequest,
    Completion,
    EmbeddingRequest,
    Embeddings,
    ToolCall,
)
from spasm.backends.keys import resolve_api_key
from spasm.backends.registry import register_backend
from spasm.backends.structured import Transport, ladder, names_format, response_format, with_instruction
from spasm.config import BackendConfig
from spasm.errors import (
    BackendError,
    ConnectionBackendError,
    EmptyCompletionError,
    FatalBackendError,
    MalformedResponseError,
    RateLimitedError,
    StructuredOutputRejectedError,
    TimeoutBackendError,
    TransientBackendError,
    UserError,
)
from spasm.limits import RATE_HEADERS, RateHeaders
from spasm.redact import redact_url

__all__ = ["OpenAIBackend", "resolve_api_key"]

log = logging.getLogger("spasm")

#: The one message of the start-up chat check (:meth:`OpenAIBackend.preflight`).
PREFLIGHT_PROMPT = "spasm preflight: reply with one word."

#: Statuses with which servers refuse a request format they do not take (llama.cpp's server
#: answers a json_schema ``response_format`` with a 500).
_REJECTION_STATUSES = frozenset({400, 415, 422, 500, 501})


def _rate_headers(headers: Any) -> dict[str, str]:
    """The headers spasm paces by (:data:`~spasm.limits.RATE_HEADERS`: ``Retry-After``,
    ``x-ratelimit-*``), lower-cased; what they mean is :mod:`spasm.limits`'s to read."""
    if headers is None:
        return {}
    return {name: str(value) for name in RATE_HEADERS if (value := headers.get(name)) is not None}


def _server_message(exc: openai.APIStatusError) -> str:
    """The server's own error message (the ``error.message`` of an OpenAI-style body)."""
    body = exc.body
    if isinstance(body, dict):
        message = body.get("message")
        return message if isinstance(message, str) else json.dumps(body, ensure_ascii=False)
    return str(body) if body else exc.message


def classify(exc: openai.OpenAIError, backend: str, timeout_s: float) -> BackendError:
    """The spasm error for an SDK exception, chosen by its type and HTTP status."""
    if isinstance(exc, openai.APITimeoutError):  # before APIConnectionError: it subclasses it
        return TimeoutBackendError(f"timeout after {timeout_s}s from {backend}")
    if isinstance(exc, openai.APIConnectionError):
        cause = redact_url(str(exc.__cause__ or exc))
        return ConnectionBackendError(f"connection error to {backend}: {cause}", detail=cause)
    if isinstance(exc, openai.APIResponseValidationError):
        return MalformedResponseError(f"malformed response body from {backend}: {exc.message}")
    if isinstance(exc, openai.APIStatusError):
        status, detail = exc.status_code, _server_message(exc)
        text = f"{status} from {backend}: {detail}"
        if isinstance(exc, openai.RateLimitError) or status == 429:
            headers = _rate_headers(exc.response.headers)
            return RateLimitedError(text, retry_after=RateHeaders.parse(headers).retry_after,
                                    detail=detail, headers=headers)
        if status in (408, 409) or status >= 500:
            return TransientBackendError(text, status=status, detail=detail)
        return FatalBackendError(text, status=status, detail=detail)
    return FatalBackendError(f"{type(exc).__name__} from {backend}: {exc}")


def _completion(resp: Any, backend: str, model: str, latency: float) -> Completion:
    """Read a chat completion; anything not shaped like one is a MalformedResponseError."""
    if not isinstance(resp, ChatCompletion):
        # The SDK returns the body as text when it is not JSON (an HTML error page, say).
        head = " ".join(str(resp).split())[:120]
        raise MalformedResponseError(f"malformed response body from {backend} (not JSON): {head!r}")
    try:
        choice = resp.choices[0]
        content = choice.message.content
        usage = resp.usage
        prompt_tokens = _token_count(usage.prompt_tokens, "prompt", backend) if usage else 0
        completion_tokens = _token_count(usage.completion_tokens, "completion", backend) if usage else 0
        cached_tokens = _cached_tokens(usage)
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
        # The SDK builds its models without validation: a body missing fields arrives as is.
        raise MalformedResponseError(
            f"malformed response body from {backend} (not a chat completion: {exc})"
        ) from exc
    if content is not None and not isinstance(content, str):
        raise MalformedResponseError(f"malformed response body from {backend} (content not text)")
    calls = _tool_calls(getattr(choice.message, "tool_calls", None), backend)
    return Completion(
        text=content or "",
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        resolved_model=getattr(resp, "model", None) or model,
        finish_reason=getattr(choice, "finish_reason", None) or "stop",
        latency_s=latency,
        cached_tokens=cached_tokens,
        tool_calls=calls,
    )


def _tool_calls(raw: Any, backend: str) -> tuple[ToolCall, ...]:
    """The tool calls of a reply: each with its id, function name and arguments
    text; a call shaped otherwise is a malformed body."""
    if not raw:
        return ()
    try:
        return tuple(ToolCall(str(c.id), str(c.function.name), str(c.function.arguments or "{}"))
                     for c in raw)
    except (AttributeError, TypeError) as exc:
        raise MalformedResponseError(
            f"malformed response body from {backend} (tool_calls: {exc})") from exc


#: No call reports more tokens than this (the longest contexts are ~10^7); a larger or negative
#: figure is a broken server, not a bill, and would overflow the token columns.
MAX_REPORTED_TOKENS = 100_000_000


def _token_count(value: Any, what: str, backend: str) -> int:
    """A usage figure, checked: an integer in [0, :data:`MAX_REPORTED_TOKENS`]."""
    if value is None:
        return 0
    try:
        count = int(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError, OverflowError):  # a dict, "many", NaN, infinity
        count = None
    if count is None or not 0 <= count <= MAX_REPORTED_TOKENS:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "…"
        raise MalformedResponseError(
            f"malformed response body from {backend} (usage.{what}_tokens = {shown}: not a token "
            f"count in 0..{MAX_REPORTED_TOKENS:,})")
    return count


def _cached_tokens(usage: Any) -> int:
    """Prompt tokens the server says its prefix cache served: ``prompt_tokens_details.
    cached_tokens`` (OpenAI, vLLM, SGLang, llama.cpp) or ``prompt_cache_hit_tokens`` (DeepSeek).
    A missing or malformed figure counts as none: it only lowers a price, never a reply."""
    if usage is None:
        return 0
    details = getattr(usage, "prompt_tokens_details", None)
    value = getattr(details, "cached_tokens", None) if details is not None else None
    if value is None:
        value = (getattr(usage, "model_extra", None) or {}).get("prompt_cache_hit_tokens")
    try:
        cached = int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0
    return max(0, min(cached, int(usage.prompt_tokens or 0)))


class _Rejected(Exception):
    """Internal: the server refused this transport (carries the server's error)."""

    def __init__(self, error: BackendError) -> None:
        super().__init__(str(error))
        self.error = error


@functools.cache
def _tls_context() -> ssl.SSLContext | None:
    """The TLS context every OpenAI client of this process shares: the one the SDK's HTTP
    library builds by default (its CA store, ``SSL_CERT_FILE`` honoured), built once. Building
    it reads the whole CA bundle (~40 ms), which each client would otherwise pay again (every
    backend of every run, every embedder). ``None`` when the library has no public builder:
    then each client builds its own, as the SDK does."""
    base = next((c for c in openai.DefaultAsyncHttpxClient.__mro__ if c.__name__ == "AsyncClient"),
                None)
    library = importlib.import_module(base.__module__.split(".")[0]) if base is not None else None
    build = getattr(library, "create_ssl_context", None)
    return build() if callable(build) else None


def _http_client() -> openai.DefaultAsyncHttpxClient | None:
    """An HTTP client with the SDK's defaults (timeouts, connection limits, redirects) and the
    shared TLS context; ``None`` lets the SDK build its own."""
    tls = _tls_context()
    return None if tls is None else openai.DefaultAsyncHttpxClient(verify=tls)


@register_backend("openai")
class OpenAIBackend(Backend):
    """A backend that speaks the OpenAI chat-completions protocol over HTTP."""

    def __init__(self, name: str, cfg: BackendConfig) -> None:
        self.name = name
        self.model = cfg.model
        self.cfg = cfg
        self.max_concurrency = cfg.max_concurrency
        self._client = openai.AsyncOpenAI(
            base_url=cfg.base_url,
            api_key=resolve_api_key(cfg.api_key_env, name),
            max_retries=0,
            timeout=cfg.timeout_s,
            http_client=_http_client(),
        )
        self._ladder = ladder(cfg.structured_output)
        self._rung = 0
        #: A structured request succeeded on the current rung: the server takes that format.
        self._confirmed = False
        # Until a rung is confirmed, structured requests go one at a time, so a rejection is
        # handled once instead of by every dialogue in flight.
        self._negotiating = anyio.Lock()
        self._steps: list[dict[str, Any]] = []

    @property
    def identity(self) -> str:
        return f"openai:{self.cfg.base_url}:{self.model}"

    @property
    def url(self) -> str:
        """The ``base_url`` for messages: without its credentials (:func:`~spasm.redact.redact_url`)."""
        return redact_url(self.cfg.base_url or "")

    @property
    def structured_mode(self) -> str | None:
        if self.cfg.structured_output == "auto" and not self._confirmed:
            return None
        return self._ladder[self._rung].label

    @property
    def structured_steps(self) -> list[dict[str, Any]]:
        return list(self._steps)

    async def preflight(self) -> None:
        """Fail fast, before any file is written: the endpoint answers, accepts the key, knows
        the model and returns an OpenAI chat completion (one 1-token chat call, not logged).

        A 4xx or a body that is not a chat completion is a :class:`UserError` quoting the
        server's status and message; a 5xx or a timeout only warns (the run's retries handle
        a server that is having a bad moment).
        """
        client = self._client.with_options(timeout=min(10.0, self.cfg.timeout_s))
        try:
            await client.models.list()
        except openai.AuthenticationError:
            raise UserError(self._key_message()) from None
        except openai.APIConnectionError as exc:
            raise UserError(
                f"Backend {self.name!r}: cannot connect to {self.url} "
                f"({exc.__cause__ or exc}). Is the server running and the URL right?"
            ) from None
        except Exception:  # /models is optional (absent, an HTML page, odd JSON):
            pass  # the endpoint is reachable; the chat call below decides whether it works
        await self._preflight_chat()

    def _key_message(self) -> str:
        where = (
            f"the key in ${self.cfg.api_key_env}" if self.cfg.api_key_env
            else "the request: it sends no key; name the variable that holds one with api_key_env"
        )
        return (f"Backend {self.name!r} at {self.url} rejected {where}. "
                "Check the key and the base_url.")

    async def _preflight_chat(self) -> None:
        body = {"model": self.model, "max_tokens": 1, "temperature": 0.0,
                "messages": [{"role": "user", "content": PREFLIGHT_PROMPT}]}
        where = f"Backend {self.name!r} ({self.url}, model {self.model!r})"
        try:
            await self._send(body)
        except FatalBackendError as exc:
            if exc.status in (401, 403):
                raise UserError(self._key_message()) from None
            hint = (" Check base_url (an OpenAI-compatible server's usually ends in /v1) and the "
                    "model name." if exc.status == 404 else "")
            raise UserError(f"{where} refused a test chat call: {exc}.{hint}") from None
        except MalformedResponseError as exc:
            raise UserError(
                f"{where} does not answer like an OpenAI-compatible server ({exc}). Check "
                "base_url: it should point at the API (e.g. http://host:8000/v1), not a web page."
            ) from None
        except ConnectionBackendError as exc:
            raise UserError(f"{where}: cannot connect ({exc}). Is the server running?") from None
        except (TransientBackendError, EmptyCompletionError) as exc:
            log.warning("%s: the test chat call failed (%s); starting anyway, calls are retried",
                        where, exc)

    # -- sending -------------------------------------------------------------------------
    def _body(self, request: ChatRequest, transport: Transport | None) -> dict[str, Any]:
        messages = list(request.messages)
        fmt: dict[str, Any] | None = None
        if transport is not None and request.json_schema is not None:
            fmt = response_format(transport, request.json_schema)
            if transport.mode != "json_schema":
                messages = with_instruction(messages, request.json_schema)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if fmt is not None:
            body["response_format"] = fmt
        if request.tools is not None:  # native tool calls
            body["tools"] = list(request.tools)
        return body

    async def _send(self, body: dict[str, Any]) -> Completion:
        start = time.perf_counter()
        try:
            # The SDK's timeout bounds each read, not the call: a server trickling a byte every
            # half second would never time out. The deadline bounds the whole request.
            with anyio.fail_after(self.cfg.timeout_s):
                # The SDK's documented raw path (``client.post``) skips its per-request parameter
                # transformation (~0.5 ms of CPU per call, a quarter of its cost: see
                # benchmarks/README.md); the body is already plain JSON, and the reply is parsed
                # into the same typed ChatCompletion.
                # Cast to the SDK's AsyncAPIResponse to keep the headers (x-ratelimit-*: the
                # provider says what is left of the key); ``parse`` reads the body into it.
                raw = await self._client.post("/chat/completions", body=body,
                                              cast_to=openai.AsyncAPIResponse[ChatCompletion])
                resp = await raw.parse()
        except TimeoutError:
            raise TimeoutBackendError(f"timeout after {self.cfg.timeout_s}s from {self.name}") from None
        except openai.OpenAIError as exc:
            raise classify(exc, self.name, self.cfg.timeout_s) from exc
        except ValueError as exc:  # json.JSONDecodeError: a JSON content type, a broken body
            raise MalformedResponseError(f"malformed response body from {self.name}: {exc}") from exc
        completion = _completion(resp, self.name, self.model, time.perf_counter() - start)
        completion.rate_headers = _rate_headers(raw.headers)
        return completion

    async def complete(self, request: ChatRequest) -> Completion:
        if request.json_schema is None:
            return await self._send(self._body(request, None))
        if self._confirmed:
            return await self._structured(request)
        async with self._negotiating:
            return await self._structured(request)

    # -- structured output ---------------------------------------------------------------
    async def _structured(self, request: ChatRequest) -> Completion:
        """Send on the current rung; on a rejection step down (or, at the bottom, fail)."""
        while True:
            rung = self._rung
            transport = self._ladder[rung]
            try:
                completion = await self._attempt(request, transport)
            except _Rejected as rejected:
                self._step_down(rung, transport, rejected.error)
                continue
            if self._rung == rung:
                self._confirmed = True
            return completion

    async def _attempt(self, request: ChatRequest, transport: Transport) -> Completion:
        """One send; raises :class:`_Rejected` when the server refuses ``transport``."""
        body = self._body(request, transport)
        try:
            return await self._send(body)
        except BackendError as exc:
            if transport.mode == "text" or exc.status not in _REJECTION_STATUSES:
                raise
            if names_format(exc.detail):
                raise _Rejected(exc) from exc
            if self._confirmed:
                raise  # this format has worked: an ordinary failure, for the retry policy
            first = exc
        # A bare 400/422/500 to a format not yet confirmed: a rejection only if it happens
        # again while a plain request works (so one injected fault does not change the mode).
        try:
            return await self._send(body)
        except BackendError as again:
            if again.status != first.status:
                raise
        # The same request without response_format (same prompt, so its length is no excuse).
        plain = {k: v for k, v in body.items() if k != "response_format"}
        plain["max_tokens"] = min(request.max_tokens, 4)
        try:
            await self._send(plain)
        except BackendError:
            raise first from None  # plain requests fail too: the server, not the format
        raise _Rejected(first)

    def _step_down(self, rung: int, transport: Transport, error: BackendError) -> None:
        if rung != self._rung:
            return  # a concurrent request already stepped past this rung
        self._steps.append(
            {"mode": transport.label, "status": error.status, "message": " ".join(error.detail.split())[:500]}
        )
        if rung + 1 >= len(self._ladder):
            raise StructuredOutputRejectedError(self.name, transport.mode, error.status, error.detail)
        self._rung = rung + 1
        self._confirmed = False

    # -- embeddings ----------------------------------------------------------------------
    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        """``POST /embeddings`` through the SDK (which asks for base64 and decodes it), once;
        a reply that is not a list of one vector per text is a :class:`MalformedResponseError`."""
        start = time.perf_counter()
        try:
            with anyio.fail_after(self.cfg.timeout_s):
                raw = await self._client.embeddings.with_raw_response.create(
                    model=self.model, input=list(request.texts))
                resp = raw.parse()
        except TimeoutError:
            raise TimeoutBackendError(f"timeout after {self.cfg.timeout_s}s from {self.name}") from None
        except openai.OpenAIError as exc:
            raise classify(exc, self.name, self.cfg.timeout_s) from exc
        except (AttributeError, TypeError, ValueError) as exc:
            # Not an embeddings body: an HTML page, a body that is not JSON (the SDK hands such a
            # body over as it is), JSON of another shape.
            raise MalformedResponseError(
                f"malformed response body from {self.name} (not an embeddings response: {exc})"
            ) from exc
        try:
            data = sorted(resp.data, key=lambda d: d.index)
            vectors = [[float(x) for x in d.embedding] for d in data]
            usage = getattr(resp, "usage", None)
            prompt_tokens = _token_count(getattr(usage, "prompt_tokens", None), "prompt", self.name)
        except (AttributeError, TypeError, ValueError) as exc:
            raise MalformedResponseError(
                f"malformed response body from {self.name} (not an embeddings response: {exc})"
            ) from exc
        return Embeddings(vectors=vectors, prompt_tokens=prompt_tokens,
                          resolved_model=getattr(resp, "model", None) or self.model,
                          latency_s=time.perf_counter() - start,
                          rate_headers=_rate_headers(raw.headers))

    async def aclose(self) -> None:
        await self._client.close()

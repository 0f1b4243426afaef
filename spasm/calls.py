"""Every LLM call goes through here: cache, limits, retries, budget and the call log (chat
completions, and embeddings requests: :meth:`Caller.embed`, retried and logged the same way but
never cached here).

Retry policy (the only one: the SDK's retries are off):

* retried: 429 (after the server's ``Retry-After``), 5xx, 408/409, timeouts, dropped
  connections, malformed response bodies and empty completions;
* a rate limit (429) is no failure: it is waited out without spending an attempt, for up to
  :data:`RATE_LIMIT_BUDGET_S` seconds of waiting per call (then each 429 spends one). The call
  waits the server's ``Retry-After`` (else a short jitter that doubles per 429 up to
  :data:`RATE_LIMIT_MAX_BACKOFF_S`); the backend's pacing (:class:`~spasm.limits.BackendLimits`:
  the provider's ``x-ratelimit-*`` headers, an AIMD rate that tells 429s about the rate from
  random ones) decides how fast its requests start; its rows in the call log carry the number
  of the attempt they delayed;
* not retried: other 4xx (bad request, auth, unknown model) and local errors;
* a server that rejects the structured-output format ends the run at once
  (:class:`~spasm.errors.StructuredOutputRejectedError`): later structured calls to that backend
  are not even sent;
* failures are told apart by exception type (each :mod:`spasm.errors` class carries its
  ``outcome`` for the log), never by their message;
* backoff: full jitter, ``uniform(0, min(30, 0.5 · 2^attempt))`` seconds, at most
  ``max_attempts`` attempts per call (backend config, default 6);
* an empty completion is re-sampled with the next seed, so a deterministic server can recover.

Every attempt is a row of the run's ``calls`` table; a cache hit is a row too. Only successful
completions are cached, keyed by the sha256 of the backend identity and the exact request, and
only from backends whose replies are a function of the request (``Backend.cacheable``: a
``python`` backend only with ``deterministic: true``).
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

import anyio
from pydantic import BaseModel, ValidationError

from spasm.backends.base import (
    Backend,
    ChatRequest,
    Completion,
    EmbeddingRequest,
    Embeddings,
    Message,
    ToolCall,
)
from spasm.backends.structured import extract_json
from spasm.config import BackendConfig
from spasm.dataset.columns import dump_params
from spasm.dataset.rows import CallRow
from spasm.errors import (
    BackendError,
    BudgetExceededError,
    EmptyCompletionError,
    EndpointRefusedError,
    FatalBackendError,
    RateLimitedError,
    StructuredOutputRejectedError,
    TransientBackendError,
    UserError,
)
from spasm.limits import BackendLimits, Ticket
from spasm.tokens import count_messages, count_tokens

log = logging.getLogger("spasm")

#: Client errors in a row, from a backend that never answered, after which the run stops.
REFUSALS_TO_STOP = 3

#: Seconds one call may spend waiting out rate limits (429) before they spend its attempts.
RATE_LIMIT_BUDGET_S = 300.0

#: A call's wait after a 429 without ``Retry-After``: full jitter from this many seconds,
#: doubling per 429 of the call, up to :data:`RATE_LIMIT_MAX_BACKOFF_S` (so a burst of 429s
#: that ends is left within seconds, not the 30 s of the other errors' backoff).
RATE_LIMIT_BASE_S = 0.05
RATE_LIMIT_MAX_BACKOFF_S = 2.0

T = TypeVar("T", bound=BaseModel)
V = TypeVar("V")
W = TypeVar("W")


class Cache:
    """A request-hash → completion store in SQLite (WAL; survives kill -9). A full disk is
    an ``OSError`` (ENOSPC) naming the cache, never a damaged cache or a bug
    (:func:`spasm.errors.disk_full`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS completions (key TEXT PRIMARY KEY, value TEXT)")
            self._db.execute("SELECT count(*) FROM completions").fetchone()
        except sqlite3.DatabaseError as exc:
            self._raise_if_full(exc)
            raise UserError(
                f"The request cache {path} is damaged ({exc}). Delete it and rerun: finished "
                "dialogues are kept; the others pay their calls again (or set engine.cache: false)."
            ) from None
        self._lock = threading.Lock()

    def _raise_if_full(self, exc: sqlite3.Error) -> None:
        """SQLite's "database or disk is full" as the ``OSError`` it is (ENOSPC)."""
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path)) from exc

    def get(self, key: str) -> Completion | None:
        """The cached completion of ``key``; a damaged entry is a miss (and is asked again)."""
        with self._lock:
            try:
                row = self._db.execute("SELECT value FROM completions WHERE key=?",
                                       (key,)).fetchone()
            except sqlite3.OperationalError as exc:
                self._raise_if_full(exc)
                raise
        if row is None:
            return None
        try:
            data = json.loads(row[0])
            calls = tuple(ToolCall(*c) for c in data.pop("tool_calls", ()))
            return Completion(**data, tool_calls=calls)
        except (TypeError, ValueError):
            return None

    def put(self, key: str, completion: Completion) -> None:
        value = json.dumps(
            {
                "text": completion.text,
                "prompt_tokens": completion.prompt_tokens,
                "completion_tokens": completion.completion_tokens,
                "resolved_model": completion.resolved_model,
                "finish_reason": completion.finish_reason,
                "latency_s": completion.latency_s,
                # Only a reply that calls tools has the key: an entry without it called none.
                **({"tool_calls": [[c.id, c.name, c.arguments] for c in completion.tool_calls]}
                   if completion.tool_calls else {}),
            }
        )
        with self._lock:
            try:
                self._db.execute("INSERT OR REPLACE INTO completions VALUES (?, ?)", (key, value))
            except sqlite3.OperationalError as exc:
                self._raise_if_full(exc)
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()


@dataclass
class Usage:
    """Running totals for the whole run (progress bar, manifest, budget caps)."""

    prompt_tokens: Counter[str] = field(default_factory=Counter)
    completion_tokens: Counter[str] = field(default_factory=Counter)
    #: Prompt tokens the APIs reported as served from their prefix caches.
    cached_tokens: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    cost: float = 0.0
    cache_hits: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    #: What people typed in their seats (``kind: human``), by role: turns and the tokens of
    #: their text, never in the model totals above (no model read or wrote them).
    typed_turns: Counter[str] = field(default_factory=Counter)
    typed_tokens: Counter[str] = field(default_factory=Counter)

    @property
    def total_tokens(self) -> int:
        return sum(self.prompt_tokens.values()) + sum(self.completion_tokens.values())

    def typed(self) -> dict[str, int]:
        """What people typed (turns, tokens of their text); empty in a run without people."""
        turns = sum(self.typed_turns.values())
        return {"typed_turns": turns, "typed_tokens": sum(self.typed_tokens.values())} if turns else {}

    def by_role(self) -> dict[str, dict[str, int]]:
        roles = sorted(set(self.calls) | set(self.prompt_tokens))
        return {
            r: {
                "calls": self.calls[r],
                "prompt_tokens": self.prompt_tokens[r],
                "completion_tokens": self.completion_tokens[r],
                "cached_tokens": self.cached_tokens[r],
            }
            for r in roles
        }


@dataclass(frozen=True)
class Structured(Generic[V]):
    """What one structured call produced: the parsed value (``None`` when no ask parsed), how
    many asks it took and their usage, the last completion, and the last validation error."""

    value: V | None
    attempts: int
    prompt_tokens: int
    completion_tokens: int
    last: Completion | None = None
    error: str | None = None

    def map(self, fn: Callable[[V | None], W]) -> Structured[W]:
        """The same call's usage with its value turned into what the caller returns."""
        return Structured(fn(self.value), self.attempts, self.prompt_tokens,
                          self.completion_tokens, self.last, self.error)

    @property
    def ok(self) -> bool:
        """Whether an ask parsed."""
        return self.value is not None


@dataclass
class CallScope:
    """Where a call belongs (its dialogue or persona) and the list its log rows go to."""

    dialogue_id: str | None = None
    persona_id: str | None = None
    records: list[CallRow] = field(default_factory=list)
    seq: int = 0

    def next_id(self) -> str:
        self.seq += 1
        return f"{self.dialogue_id or self.persona_id or 'run'}#{self.seq:04d}"


def outcome_of(exc: BaseException) -> str:
    """The ``calls.outcome`` of a failed attempt: the ``outcome`` its error class declares."""
    outcome = getattr(type(exc), "outcome", None)
    return outcome if isinstance(outcome, str) else "error"


class Caller:
    """Runs requests against named backends with one policy for limits, retries and caching."""

    def __init__(
        self,
        backends: dict[str, Backend],
        configs: dict[str, BackendConfig],
        *,
        cache: Cache | None = None,
        max_cost: float | None = None,
        max_tokens: int | None = None,
        reask_attempts: int = 2,
        sleep_scale: float = 1.0,
        rate_limit_budget_s: float = RATE_LIMIT_BUDGET_S,
    ) -> None:
        self.backends = backends
        self.configs = configs
        self.cache = cache
        self.max_cost = max_cost
        self.max_tokens = max_tokens
        self.reask_attempts = reask_attempts
        self.sleep_scale = sleep_scale
        self.usage = Usage()
        self.rate_limit_budget_s = rate_limit_budget_s
        self.limits = {
            name: BackendLimits(b.max_concurrency, configs[name].rpm, configs[name].tpm,
                                scale=sleep_scale)
            for name, b in backends.items()
        }
        self._rng = random.Random()
        #: The first structured-output rejection of the run; it ends the run (the engine raises it).
        self.rejection: StructuredOutputRejectedError | None = None
        #: Set when a backend refuses every call it gets (the run stops: :meth:`stop_reason`).
        self.refusal: EndpointRefusedError | None = None
        self._refused: Counter[str] = Counter()
        self._answered: set[str] = set()
        self._warned_retry: set[str | tuple[str, str]] = set()
        #: Distinguishes the call ids of passes of a resumed run (a retried dialogue logs again).
        self.pass_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")

    def _check_budget(self) -> None:
        if self.max_cost is not None and self.usage.cost >= self.max_cost:
            raise BudgetExceededError(f"cost cap reached ({self.usage.cost:.4f} ≥ {self.max_cost})")
        if self.max_tokens is not None and self.usage.total_tokens >= self.max_tokens:
            raise BudgetExceededError(
                f"token cap reached ({self.usage.total_tokens} ≥ {self.max_tokens})"
            )

    def _account(self, role: str, backend: str, c: Completion | Embeddings) -> None:
        if self.backends[backend].typed_by_person:
            self.usage.typed_turns[role] += 1
            self.usage.typed_tokens[role] += c.completion_tokens
            return
        prices = self.configs[backend].prices
        self.usage.prompt_tokens[role] += c.prompt_tokens
        self.usage.completion_tokens[role] += c.completion_tokens
        self.usage.cached_tokens[role] += c.cached_tokens
        self.usage.calls[role] += 1
        self.usage.cost += prices.cost(c.prompt_tokens, c.completion_tokens, c.cached_tokens)

    def _record(
        self,
        scope: CallScope,
        *,
        role: str,
        backend: Backend,
        request: ChatRequest | EmbeddingRequest,
        key: str,
        attempt: int,
        outcome: str,
        completion: Completion | Embeddings | None,
        latency: float,
        error: str | None,
        started: datetime,
        cache_hit: bool = False,
    ) -> CallRow:
        self.usage.outcomes[outcome] += 1
        # A person's reply is no model's: its row says no model tokens (the turn has its length).
        model = completion if completion is not None and not backend.typed_by_person else None
        row = CallRow(
            call_id=f"{self.pass_id}:{scope.next_id()}",
            dialogue_id=scope.dialogue_id,
            persona_id=scope.persona_id,
            role=role,
            backend=backend.name,
            model=backend.model,
            resolved_model=completion.resolved_model if completion else None,
            request_hash=key,
            params=dump_params(request.params()),
            attempt=attempt,
            prompt_tokens=model.prompt_tokens if model else 0,
            completion_tokens=model.completion_tokens if model else 0,
            cached_tokens=model.cached_tokens if model else 0,
            latency_s=latency,
            cache_hit=cache_hit,
            outcome=outcome,
            error=error,
            started_at=started,
        )
        scope.records.append(row)
        return row

    async def complete(
        self, role: str, backend_name: str, request: ChatRequest, scope: CallScope
    ) -> Completion:
        """One logical call: cached, rate-limited, retried; returns a non-empty completion."""
        completion, _ = await self._call(role, backend_name, request, scope)
        return completion

    async def embed(
        self, role: str, backend_name: str, request: EmbeddingRequest, scope: CallScope
    ) -> Embeddings:
        """One embeddings request (:meth:`Backend.embed`) on the same path as a chat call:
        rate-limited, retried, within the budget, each attempt a row of ``scope``'s call log.
        Never cached here: the embedder's own cache (:mod:`spasm.evaluation.embeddings.cache`)
        keeps vectors by text."""
        answer, _ = await self._call(role, backend_name, request, scope)
        return answer

    @overload
    async def _call(
        self, role: str, backend_name: str, request: ChatRequest, scope: CallScope,
        check: Callable[[Completion], str | None] | None = None,
    ) -> tuple[Completion, str | None]: ...
    @overload
    async def _call(
        self, role: str, backend_name: str, request: EmbeddingRequest, scope: CallScope,
        check: None = None,
    ) -> tuple[Embeddings, str | None]: ...
    async def _call(
        self, role: str, backend_name: str, request: ChatRequest | EmbeddingRequest,
        scope: CallScope, check: Callable[[Completion], str | None] | None = None,
    ) -> tuple[Completion, str | None] | tuple[Embeddings, str | None]:
        """:meth:`complete` (and :meth:`embed`); with ``check``, the answer (a cache hit too)
        is validated before its call-log row is written, so the row is written once with its
        final outcome (``invalid_output`` and the check's error when it fails). Returns the
        completion and the check's error."""
        backend = self.backends[backend_name]
        cfg = self.configs[backend_name]
        key = request.cache_key(backend.identity)
        chat = isinstance(request, ChatRequest)
        # A backend whose replies are not a function of the request (user code) is neither
        # replayed from the cache nor stored in it; embeddings are cached by the embedder.
        cache = self.cache if backend.cacheable and chat else None
        if cache is not None:
            hit = cache.get(key)
            if hit is not None:
                self.usage.cache_hits += 1
                self._account(role, backend_name, hit)
                invalid = check(hit) if check is not None else None
                self._record(
                    scope, role=role, backend=backend, request=request, key=key, attempt=0,
                    outcome="cache_hit" if invalid is None else "invalid_output", completion=hit,
                    latency=0.0, error=invalid, started=datetime.now(UTC), cache_hit=True,
                )
                return hit, invalid
        if (
            request.json_schema is not None
            and self.rejection is not None
            and self.rejection.backend == backend_name
        ):
            raise self.rejection  # fail fast: the server has refused this format already
        if self.refusal is not None and self.refusal.backend == backend_name:
            raise self.refusal
        limits = self.limits[backend_name]
        # Counting tokens costs CPU; only a TPM bucket or a provider that limits tokens needs it.
        counted = 0
        if limits.wants_tokens:
            counted = (count_messages(request.messages) if isinstance(request, ChatRequest)
                       else sum(map(count_tokens, request.texts)))
        attempt_request = request
        attempt = 1  # attempts spent so far: rate limits (429) spend none within the budget
        limited = 0  # 429s this call has had
        waited = 0.0  # seconds it has waited them out (before sleep_scale)
        while True:
            self._check_budget()
            started = datetime.now(UTC)
            t0 = time.perf_counter()
            ticket: Ticket | None = None
            try:
                try:
                    async with limits.slots:
                        ticket = await limits.admit(counted, request.max_tokens)
                        completion: Completion | Embeddings = (
                            await backend.complete(attempt_request)
                            if isinstance(attempt_request, ChatRequest)
                            else await backend.embed(attempt_request))
                    limits.answered(ticket, completion.rate_headers, counted_prompt=counted,
                                    reported_prompt=completion.prompt_tokens)
                    if (isinstance(completion, Completion) and not completion.text.strip()
                            and not completion.tool_calls):
                        raise EmptyCompletionError(f"empty completion from {backend_name}")
                except RateLimitedError as exc:
                    if ticket is not None:
                        limits.refused(ticket, exc.headers, exc.retry_after)
                    raise
            except StructuredOutputRejectedError as exc:
                self._record(
                    scope, role=role, backend=backend, request=attempt_request, key=key,
                    attempt=attempt, outcome=exc.outcome, completion=None,
                    latency=time.perf_counter() - t0, error=str(exc), started=started,
                )
                if self.rejection is None:
                    self.rejection = exc
                raise
            except BackendError as exc:
                latency = time.perf_counter() - t0
                self._record(
                    scope, role=role, backend=backend, request=attempt_request, key=key,
                    attempt=attempt, outcome=outcome_of(exc), completion=None, latency=latency,
                    error=str(exc), started=started,
                )
                self._note_refusal(backend_name, exc)
                if isinstance(exc, RateLimitedError):
                    limited += 1
                    if waited < self.rate_limit_budget_s:
                        # Waited out, not an attempt: the server asked us to slow down.
                        delay = min(self._rate_limit_delay(exc, limited),
                                    self.rate_limit_budget_s - waited)
                        waited += delay
                        self._warn_retry(backend_name, exc, cfg)
                        t_wait = time.perf_counter()
                        await anyio.sleep(delay * self.sleep_scale)
                        limits.retry_wait_s += time.perf_counter() - t_wait
                        continue
                if not isinstance(exc, TransientBackendError) or attempt == cfg.max_attempts:
                    raise
                self._warn_retry(backend_name, exc, cfg)
                delay = self._rng.uniform(0, min(30.0, 0.5 * 2 ** (attempt - 1)))
                if isinstance(exc, RateLimitedError) and exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, self.rate_limit_budget_s))
                if (isinstance(exc, EmptyCompletionError) and isinstance(attempt_request, ChatRequest)
                        and attempt_request.seed is not None):
                    attempt_request = replace(attempt_request, seed=attempt_request.seed + 1)
                attempt += 1
                await anyio.sleep(delay * self.sleep_scale)
                continue
            finally:
                if ticket is not None:
                    limits.release(ticket)  # a timeout, a dropped connection, a cancellation
            latency = time.perf_counter() - t0
            self._answered.add(backend_name)
            self._account(role, backend_name, completion)
            if isinstance(completion, Embeddings):
                self._record(
                    scope, role=role, backend=backend, request=attempt_request, key=key,
                    attempt=attempt, outcome="ok", completion=completion, latency=latency,
                    error=None, started=started,
                )
                return completion, None
            invalid = check(completion) if check is not None else None
            self._record(
                scope, role=role, backend=backend, request=attempt_request, key=key,
                attempt=attempt, outcome="ok" if invalid is None else "invalid_output",
                completion=completion, latency=latency, error=invalid, started=started,
            )
            if cache is not None:
                cache.put(key, completion)
            return completion, invalid

    def _rate_limit_delay(self, exc: RateLimitedError, limited: int) -> float:
        """Seconds a call waits after its ``limited``-th 429: the server's ``Retry-After`` when
        it sent one, else full jitter from :data:`RATE_LIMIT_BASE_S` doubling per 429 up to
        :data:`RATE_LIMIT_MAX_BACKOFF_S`. The backend's pacing (:mod:`spasm.limits`) slows the
        rate when the 429s are about it; this only spaces one call's retries."""
        if exc.retry_after is not None:
            return exc.retry_after
        return self._rng.uniform(0, min(RATE_LIMIT_MAX_BACKOFF_S,
                                        RATE_LIMIT_BASE_S * 2 ** (limited - 1)))

    def _warn_retry(self, backend_name: str, exc: BackendError, cfg: BackendConfig) -> None:
        """The one-line warning of a backend's first retry (and of its first rate limit)."""
        if isinstance(exc, RateLimitedError):
            if (backend_name, "429") not in self._warned_retry:
                self._warned_retry.add((backend_name, "429"))
                log.warning("backend %r is rate limiting (%s); calls wait it out (up to %.0f s "
                            "each, not counted as attempts) and its request rate is lowered until "
                            "the 429s stop", backend_name, exc, self.rate_limit_budget_s)
        elif backend_name not in self._warned_retry:
            self._warned_retry.add(backend_name)
            log.warning("calls to backend %r are being retried (%s); up to %d attempts "
                        "per call (max_attempts)", backend_name, exc, cfg.max_attempts)

    def _note_refusal(self, backend_name: str, exc: BackendError) -> None:
        """Count client errors of a backend that has never answered; stop after a few."""
        if backend_name in self._answered or not isinstance(exc, FatalBackendError):
            return
        if exc.status is None or not 400 <= exc.status < 500:
            return
        self._refused[backend_name] += 1
        if self._refused[backend_name] >= REFUSALS_TO_STOP and self.refusal is None:
            self.refusal = EndpointRefusedError(backend_name, exc.status, str(exc),
                                                self._refused[backend_name])

    def rate_limit_report(self) -> dict[str, dict[str, Any]]:
        """Per backend: whether it is paced now and at what rate, its 429s and the seconds its
        requests waited (:meth:`spasm.limits.BackendLimits.report`)."""
        return {name: limits.report() for name, limits in self.limits.items()}

    @property
    def stop_reason(self) -> StructuredOutputRejectedError | EndpointRefusedError | None:
        """An error that must end the whole run now (the engine checks after each dialogue)."""
        return self.rejection or self.refusal

    async def structured(
        self,
        role: str,
        backend_name: str,
        messages: list[Message],
        schema: type[T],
        scope: CallScope,
        *,
        temperature: float,
        max_tokens: int = 256,
        seed: int | None = None,
    ) -> Structured[T]:
        """A structured call: parse into ``schema``; re-ask with the error.

        This is spasm's one structured-output loop. The backend sends the request in its mode
        (json_schema, json_object or text: :mod:`spasm.backends.structured`); the reply is read
        with :func:`~spasm.backends.structured.extract_json` whatever the mode, so fences and
        prose around the JSON do not matter. The result carries the parsed value (``None`` when
        no ask parsed: the caller decides the safe fallback and counts it), the number of asks
        and their usage, so no caller reads the call log back. A server that rejects the format
        raises :class:`~spasm.errors.StructuredOutputRejectedError`, which no caller may fall
        back on.
        """
        convo = list(messages)
        json_schema = _json_schema(schema)
        prompt_tokens = completion_tokens = 0
        error: str | None = None
        completion: Completion | None = None
        parsed: list[T] = []

        def check(answer: Completion) -> str | None:
            """Why ``answer`` does not parse into ``schema`` (its row's error), or ``None``."""
            try:
                parsed.append(schema.model_validate(extract_json(answer.text)))
            except json.JSONDecodeError as exc:
                return f"not valid JSON: {exc.msg} at position {exc.pos}"
            except ValidationError as exc:
                return _short_error(exc)
            return None

        for ask in range(self.reask_attempts + 1):
            request = ChatRequest(
                messages=tuple(convo), temperature=temperature, max_tokens=max_tokens,
                seed=seed, json_schema=json_schema,
            )
            completion, error = await self._call(role, backend_name, request, scope, check)
            prompt_tokens += completion.prompt_tokens
            completion_tokens += completion.completion_tokens
            if error is None:
                return Structured(parsed[0], ask + 1, prompt_tokens, completion_tokens, completion)
            if ask == self.reask_attempts:
                break
            convo = [
                *convo,
                {"role": "assistant", "content": completion.text},
                {
                    "role": "user",
                    "content": f"That reply did not validate: {error}. Reply again with only a "
                    f"JSON object that follows this schema: {json.dumps(json_schema)}",
                },
            ]
        return Structured(None, self.reask_attempts + 1, prompt_tokens, completion_tokens,
                          completion, error)


@functools.cache
def _json_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema, built once (pydantic rebuilds it on every call otherwise)."""
    return schema.model_json_schema()


def _short_error(exc: ValidationError) -> str:
    parts = [f"{'.'.join(str(x) for x in e['loc']) or 'reply'}: {e['msg']}" for e in exc.errors()]
    return "; ".join(parts[:5])

"""How evaluation's probe and judge reach a model: through the engine's one call path.

The drift probe (``--mode probe``) and the echoing judge (``--judge``) make their structured
calls with :meth:`spasm.calls.Caller.structured`, like every other model call of spasm: the
same cache, limits, retries, structured-output re-ask and ``calls`` log, on every backend,
the embedded one included.

* **Which backend** (:func:`resolve_backend`): an explicit :class:`~spasm.config.BackendConfig`
  (the CLI's endpoint flags); else a backend of the run's ``config.json`` by name; else the
  run's helper backend (its first pairing's client, a group run's first client seat's:
  :attr:`spasm.config.RunConfig.helper_backend`). ``embedded`` (the embedded default) is always
  available, so imported runs, which have no ``config.json``, can be judged offline.
* **Cache**: the run's ``cache.sqlite``, so a rerun is answered without a request.
* **Call log**: every call (roles ``eval_probe`` / ``eval_judge``) is appended to the run's
  ``calls`` table as one committed batch (:class:`RunCallLog`, which holds the run's write lock
  while the LLM stages run, so a generation cannot write the run at the same time); the
  embedder's requests (role ``eval_embed``) as a batch of their own (:func:`log_calls`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.from_thread import start_blocking_portal
from pydantic import BaseModel

from spasm.backends import Backend, ChatRequest, Completion, make_backend
from spasm.backends.base import Message
from spasm.calls import Cache, Caller, CallScope
from spasm.config import BackendConfig, RunConfig, parse_config
from spasm.dataset.lock import RunLock
from spasm.dataset.rows import CallRow
from spasm.dataset.store import RunStore
from spasm.errors import BackendError, ConfigError, SpasmError, UserError
from spasm.evaluation.metrics import LLMUsage

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "JUDGE_ROLE",
    "PROBE_ROLE",
    "EvalBackend",
    "EvalLLM",
    "EvalSession",
    "RunCallLog",
    "ShardCalls",
    "log_calls",
    "resolve_backend",
]

PROBE_ROLE = "eval_probe"
JUDGE_ROLE = "eval_judge"
DEFAULT_MAX_TOKENS = 400
#: Sampling seed of every evaluation call: a rerun sends the same request, so the cache answers.
EVAL_SEED = 0
#: One re-ask with the validation error, then the caller's safe fallback (docs/evaluation.md).
REASK_ATTEMPTS = 1

T = TypeVar("T", bound=BaseModel)
R = TypeVar("R")


@dataclass(frozen=True)
class EvalBackend:
    """The backend the probe and the judge use, and where the choice came from."""

    name: str
    config: BackendConfig
    source: str


def _stored(name: str, config: BackendConfig) -> BackendConfig:
    """A backend of the run's config.json, unless its base_url lost its credentials there."""
    from spasm.redact import REDACTED

    if REDACTED in (config.base_url or "") and "@" in (config.base_url or ""):
        raise UserError(
            f"Backend {name!r} of the run's config.json had credentials in its base_url, which "
            f"are never stored ({config.base_url}). Pass --llm-base-url with them (and "
            "--llm-model) to use that endpoint."
        )
    return config


def _run_config(run_dir: Path) -> RunConfig | None:
    """The config a run was generated with (``None`` for imported runs, which have none)."""
    path = run_dir / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return parse_config(data["config"], str(path))
    except (ValueError, KeyError, TypeError, ConfigError) as exc:
        raise UserError(
            f"{path} cannot be read as a spasm run config ({exc}); pass --llm-base-url and "
            "--llm-model, or --llm-backend embedded, to choose the evaluation LLM yourself."
        ) from None


def resolve_backend(
    run_dir: str | Path, *, name: str | None = None, config: BackendConfig | None = None
) -> EvalBackend:
    """Choose the backend for the probe and the judge.

    Args:
        run_dir: the run being evaluated.
        name: a backend of the run's ``config.json`` (``embedded`` works for any run).
        config: an explicit backend (e.g. an OpenAI-compatible endpoint); ``name`` then
            only names it (default ``eval``).

    Raises:
        UserError: the name is not a backend of the run, or the run has no config.json
            and nothing was chosen.
    """
    if config is not None:
        return EvalBackend(name or "eval", config, "given")
    run_dir = Path(run_dir)
    run = _run_config(run_dir)
    if name is None:
        if run is None:
            raise UserError(
                f"{run_dir} has no config.json (an imported run?), so it names no backend for "
                "--mode probe / --judge. Pass --llm-backend embedded for the embedded model, or "
                "--llm-base-url URL --llm-model MODEL for an OpenAI-compatible endpoint."
            )
        default = run.helper_backend
        first = "first client seat's" if run.participants is not None else "first pairing's client"
        return EvalBackend(default, _stored(default, run.backends[default]),
                           f"run config ({first})")
    if run is not None and name in run.backends:
        return EvalBackend(name, _stored(name, run.backends[name]), "run config")
    if name == "embedded":
        return EvalBackend(name, BackendConfig(kind="embedded"), "embedded default")
    known = sorted(run.backends) if run is not None else []
    raise UserError(
        f"--llm-backend {name!r} is not a backend of {run_dir / 'config.json'} "
        f"(it has: {', '.join(known) or 'none'}); use one of those, 'embedded', or "
        "--llm-base-url and --llm-model for another endpoint."
    )


class _PreflightOnFirstCall(Backend):
    """Runs the backend's preflight before its first real request, not at start-up.

    A rerun answered from the cache then makes no request at all, while a wrong URL or key
    still fails at once with the preflight's UserError instead of after every retry.
    """

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = inner.model
        self.max_concurrency = inner.max_concurrency
        self._checked = False
        self._lock: anyio.Lock | None = None  # made on the loop that uses it

    @property
    def identity(self) -> str:
        return self.inner.identity

    # getattr: what the backend reports about its structured-output mode, where it reports it.
    @property
    def structured_mode(self) -> str | None:
        mode = getattr(self.inner, "structured_mode", None)
        return mode if isinstance(mode, str) else None

    @property
    def structured_steps(self) -> list[dict[str, Any]]:
        steps = getattr(self.inner, "structured_steps", None)
        return list(steps) if isinstance(steps, list) else []

    async def complete(self, request: ChatRequest) -> Completion:
        if not self._checked:
            if self._lock is None:
                self._lock = anyio.Lock()
            async with self._lock:
                if not self._checked:
                    await self.inner.preflight()
                    self._checked = True
        return await self.inner.complete(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class ShardCalls:
    """An :class:`EvalLLM` that judges a shard of the dialogues for another (its driver): the
    driver's call-id pass and the shard's call scopes so far, and the cache to use (the run's,
    reached through the driver). Such an EvalLLM writes no call log: its scopes go back to the
    driver (:meth:`EvalLLM.adopt`), which logs them with its own."""

    pass_id: str
    scopes: dict[str, CallScope]
    cache: Cache


@dataclass
class EvalSession:
    """The stages' access to the model: the Caller, the backend name, the sampling, and one
    call scope per dialogue (shared by the probe and the judge, so call ids stay unique)."""

    caller: Caller
    backend: str
    temperature: float
    max_tokens: int
    seed: int = EVAL_SEED
    scopes: dict[str, CallScope] = field(default_factory=dict)

    async def structured(
        self, role: str, dialogue_id: str, messages: list[Message], schema: type[T]
    ) -> T | None:
        """A structured call logged under ``dialogue_id``; ``None`` means: fall back.

        ``None`` when the reply never validated (after the Caller's re-ask) or the backend
        failed (:class:`~spasm.errors.BackendError` after its retries). Anything else — a
        server that refuses structured output, a failed preflight — propagates: falling back
        on every call would hide it. Calls of one dialogue must not overlap: they share one
        scope, whose last row the Caller marks on bad output.
        """
        scope = self.scopes.setdefault(dialogue_id, CallScope(dialogue_id=dialogue_id))
        try:
            result = await self.caller.structured(
                role, self.backend, messages, schema, scope,
                temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed,
            )
            return result.value
        except BackendError:
            return None

    @property
    def records(self) -> list[CallRow]:
        """The call-log rows of this stage, dialogue by dialogue."""
        return [r for s in self.scopes.values() for r in s.records]

    def calls(self, role: str) -> int:
        """Requests this backend made for ``role``: every attempt, re-ask and cache hit."""
        return sum(1 for r in self.records if r.role == role and r.backend == self.backend)


def _spasm_error(group: BaseExceptionGroup[BaseException]) -> SpasmError | None:
    """The first error spasm raised on purpose in a task group's exceptions: a failed preflight
    (UserError) or a server that refuses structured output (a RunError no layer falls back on)."""
    for exc in group.exceptions:
        if isinstance(exc, SpasmError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _spasm_error(exc)
            if found is not None:
                return found
    return None


class EvalLLM:
    """The evaluation's model(s): one Caller for every stage and judge, the run's cache and
    write lock, the calls made. A context manager; on exit the calls go to the run's log.

    The stages run on one event loop, in a thread of its own (an anyio blocking portal), so
    each backend keeps its connections and what it learnt (e.g. the structured-output mode a
    server takes) from the probe to the judge. With several backends (a judge ensemble) each
    has its own :class:`EvalSession`; all share the per-dialogue call scopes, so call ids stay
    unique, and the judges run one after another so the calls of a dialogue never overlap.
    """

    def __init__(
        self,
        run_dir: str | Path,
        backend: EvalBackend | Sequence[EvalBackend],
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        locked: bool = False,
        shard: ShardCalls | None = None,
    ):
        if max_tokens < 1:
            raise UserError("The evaluation LLM's max_tokens must be at least 1.")
        backends = [backend] if isinstance(backend, EvalBackend) else list(backend)
        if not backends:
            raise UserError("The evaluation needs at least one LLM backend.")
        names = [b.name for b in backends]
        if len(set(names)) != len(names):
            raise UserError(f"A judge is named twice ({', '.join(names)}); name each backend once.")
        self.run_dir = Path(run_dir)
        self.backends = backends
        self.backend = backends[0]
        self.max_tokens = max_tokens
        self._shard = shard
        self.log: RunCallLog | None = RunCallLog(self.run_dir, locked=locked) if shard is None else None
        try:
            # Built now so that a missing API key fails before any embedding work.
            self._models = {b.name: _PreflightOnFirstCall(make_backend(b.name, b.config)) for b in backends}
            self.cache = Cache(self.run_dir / "cache.sqlite") if shard is None else shard.cache
        except BaseException:
            if self.log is not None:
                self.log.close()
            raise
        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        # Built on the loop, so the Caller's limits belong to it.
        self.sessions: dict[str, EvalSession] = self._portal.call(self._sessions)
        self.session: EvalSession = self.sessions[self.backend.name]

    def _sessions(self) -> dict[str, EvalSession]:
        configs = {b.name: b.config for b in self.backends}
        caller = Caller(dict(self._models), configs, cache=self.cache, reask_attempts=REASK_ATTEMPTS)
        caller.pass_id = "eval-" + caller.pass_id  # call ids "eval-<time>:<dialogue>#<seq>"
        scopes: dict[str, CallScope] = {}
        if self._shard is not None:  # one pass of the driver's: its call ids, its scopes
            caller.pass_id = self._shard.pass_id
            scopes = dict(self._shard.scopes)
        return {
            name: EvalSession(caller, name, cfg.temperatures.judge, self.max_tokens, scopes=scopes)
            for name, cfg in configs.items()
        }

    def run(self, fn: Callable[[EvalSession], Awaitable[R]], backend: str | None = None) -> R:
        """Run one stage, ``await fn(session)``, on the evaluation's event loop, with the
        session of ``backend`` (default: the first)."""
        session = self.sessions[backend or self.backend.name]

        async def stage() -> R:
            try:
                return await fn(session)
            except BaseExceptionGroup as group:  # anyio task groups wrap what a task raised
                error = _spasm_error(group)
                if error is not None:
                    raise error from None
                raise

        return self._portal.call(stage)

    @property
    def records(self) -> list[CallRow]:
        """The call-log rows so far."""
        return self.session.records

    @property
    def pass_id(self) -> str:
        """The prefix of this evaluation's call ids (``eval-<time>``)."""
        return self.session.caller.pass_id

    def shard_calls(self, cache: Cache, dialogue_ids: Sequence[str]) -> ShardCalls:
        """What an :class:`EvalLLM` judging ``dialogue_ids`` elsewhere (a Ray task of
        ``spasm eval --ray``) needs to make its calls part of this one's: the call ids' pass,
        the dialogues' scopes so far (so their call ids go on), and ``cache``."""
        scopes = self.session.scopes
        return ShardCalls(self.pass_id, {d: scopes[d] for d in dialogue_ids if d in scopes}, cache)

    def adopt(self, scopes: Mapping[str, CallScope]) -> None:
        """Take over the call scopes a shard's :class:`EvalLLM` returned: their rows go to the
        run's call log with this one's, and later calls of those dialogues number on."""
        self.session.scopes.update(scopes)

    def usage(self, backend: str | None = None) -> LLMUsage:
        """Calls, tokens and cost so far of ``backend`` (default: the first; cache hits cost
        nothing)."""
        chosen = next(b for b in self.backends if b.name == (backend or self.backend.name))
        return usage_of([r for r in self.records if r.backend == chosen.name], chosen)

    def __enter__(self) -> EvalLLM:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the backend and the loop (cancelling what still runs after an error), then
        append the calls to the run's call log and release the cache and the lock."""
        try:
            try:
                for model in self._models.values():
                    self._portal.call(model.aclose)
            finally:
                self._portal_cm.__exit__(exc_type, exc, tb)
            if self.records and self.log is not None:
                self.log.append(self.session.caller.pass_id, self.records)
        finally:
            if self.log is not None:  # a shard's cache and log are its driver's
                self.cache.close()
                self.log.close()


def usage_of(records: Sequence[CallRow], backend: EvalBackend) -> LLMUsage:
    """Summarise call-log rows for metrics.json."""
    prices = backend.config.prices
    paid = [r for r in records if not r.cache_hit]
    by_role: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    for r in records:
        by_role[r.role] = by_role.get(r.role, 0) + 1
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    return LLMUsage(
        backend=backend.name,
        kind=backend.config.kind,
        model=backend.config.model,
        source=backend.source,
        calls=len(records),
        cache_hits=len(records) - len(paid),
        prompt_tokens=sum(r.prompt_tokens for r in paid),
        completion_tokens=sum(r.completion_tokens for r in paid),
        cost=sum(prices.cost(r.prompt_tokens, r.completion_tokens, r.cached_tokens) for r in paid),
        calls_by_role=dict(sorted(by_role.items())),
        outcomes=dict(sorted(outcomes.items())),
    )


class RunCallLog:
    """The run's ``calls`` table, as evaluation appends to it: the one place it writes run tables.

    Holds the run's write lock from construction to :meth:`close` (a second writer, e.g. a
    resumed ``spasm generate``, fails at once with a UserError naming the process); with
    ``locked`` the caller holds it already (``spasm eval``, for the whole evaluation).
    """

    def __init__(self, run_dir: Path, *, locked: bool = False) -> None:
        self.run_dir = run_dir
        self._lock: RunLock | None = None if locked else RunLock(run_dir).acquire()

    def append(self, batch_id: str, records: Sequence[CallRow]) -> None:
        """Append rows to the ``calls`` table as one committed batch, through the run store."""
        RunStore(self.run_dir).write_batch(batch_id, {"calls": list(records)})

    def close(self) -> None:
        """Release the run's write lock (if it took it)."""
        if self._lock is not None:
            self._lock.release()


def log_calls(run_dir: Path, batch: str, records: Sequence[CallRow], *, locked: bool) -> None:
    """Append ``records`` (if any) to the run's ``calls`` table as one committed batch,
    ``<batch>-<time>``, through a :class:`RunCallLog` that holds the run's write lock for the
    append (``locked``: the caller holds it already). The embedder's rows of ``spasm eval``
    (role ``eval_embed``) take this way; the probe's and the judges' go with :class:`EvalLLM`."""
    if not records:
        return
    log = RunCallLog(run_dir, locked=locked)
    try:
        log.append(f"{batch}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%f')}", records)
    finally:
        log.close()

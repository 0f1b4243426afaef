"""``spasm eval --ray``: the stages that grow with the corpus, on a Ray cluster.

* **Embedding** (:class:`RayEmbedder`): an :class:`~spasm.evaluation.embeddings.Embedder` whose
  ``embed`` splits the texts over Ray actors, one per worker slot of the cluster (a CPU by
  default), each holding its own session of the named embedder (built with
  :func:`create_embedder`, as locally, with one onnxruntime thread per slot for ``local`` and
  ``static``). The texts are sorted by length and cut into one contiguous slice per actor, so
  each pads as little as a local run; the vectors come back through Ray's object store, one
  chunk at a time. Its ``name`` is the wrapped embedder's, so it reads and fills the run's
  embedding cache (on the head node, in the run directory) exactly like a local run; the
  workers' call-log rows (the ``openai`` embedder's requests, role ``eval_embed``) come back
  to the driver (:attr:`RayEmbedder.records`), which appends them to the run's ``calls``
  table as a local run does.
* **The per-dialogue stages** (:class:`RayStages`): realism (lexical diversity and the Client
  diagnostics), the language scan, the echoing rule and the LLM echoing judge(s) run as Ray
  tasks, one per contiguous shard of the dialogues (in the run's order); the driver merges the
  shards' rows in that order and computes every summary over the whole corpus, so the files
  are those of a local run. A judge task makes its calls through :mod:`spasm.calls` like the
  local path: an :class:`~spasm.evaluation.llm.EvalLLM` of its own (each backend's
  ``max_concurrency``, ``rpm`` and ``tpm``, and ``--concurrency``, divided among the tasks
  running at once), the run's request cache through one actor on the driver's node (the one
  writer of ``cache.sqlite`` besides the driver), and its call-log rows back to the driver,
  which appends them to the run's ``calls`` table with its own.

Both cut their work with :func:`shards` and collect it with :func:`gather` (a lost worker is
one :class:`~spasm.errors.RunError` saying what to do; an error spasm raised on purpose in a
task, e.g. a failed preflight, is raised as itself).

Ray is an optional extra (``pip install 'spasm[ray]'``); this module imports it only through
:mod:`spasm.raycluster`. What the tasks run is imported inside them: a worker loads only the
stage it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from spasm.dataset.rows import CallRow
from spasm.errors import RunError, SpasmError, UserError
from spasm.evaluation.embeddings import FloatArray, create_embedder, embedder_calls
from spasm.evaluation.embeddings.openai_api import embed_call_prefix

if TYPE_CHECKING:
    import pandas as pd

    from spasm.backends.base import Completion
    from spasm.calls import CallScope
    from spasm.evaluation.echoing import EchoVerdict
    from spasm.evaluation.llm import EvalBackend, EvalLLM
    from spasm.evaluation.loader import Conversation
    from spasm.evaluation.metrics import LanguageFlag
    from spasm.personas.persona import Persona

__all__ = ["RayEmbedder", "RayStages", "gather", "shards"]

#: Texts per actor and call: the pipeline hands ``chunk_size`` texts at a time.
TEXTS_PER_WORKER = 1024

R = TypeVar("R")


def shards(n: int, parts: int, order: Sequence[int] | None = None) -> list[npt.NDArray[np.int64]]:
    """``parts`` contiguous, non-empty runs of ``order`` (default ``0..n-1``), as even as
    possible: the indices each worker gets."""
    items = np.asarray(range(n) if order is None else order, dtype=np.int64)
    return [p for p in np.array_split(items, max(1, min(parts, n))) if len(p)]


def gather(ray: Any, refs: Sequence[Any], what: str,
           on_done: Callable[[int], None] | None = None) -> list[Any]:
    """The results of ``refs``, in their order (``on_done(i)`` as the ``i``-th completes).

    Raises:
        SpasmError: the one a task raised on purpose (a failed preflight, a refused
            structured output), as itself.
        RunError: a worker lost (an OOM kill, a node down) or a task that failed otherwise.
    """
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                ray.get(ref)  # raises here, for the first task that failed
                if on_done is not None:
                    on_done(index[ref])
        return list(ray.get(list(refs)))
    except ray.exceptions.RayError as exc:
        for ref in pending:
            ray.cancel(ref, force=True)
        cause = getattr(exc, "cause", None)
        if isinstance(cause, SpasmError):
            kind = UserError if isinstance(cause, UserError) else RunError
            raise kind(str(cause)) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunError(
            f"The Ray {what} workers failed ({type(exc).__name__}: {first}). What was "
            "embedded before is in the run's embedding cache, what was judged in its request "
            "cache: run the same command again, with fewer workers per node if they ran out of "
            "memory, or without --ray."
        ) from None


class _Worker:
    """One Ray actor: its own session of the embedder, and the per-dialogue stages' shards
    (:meth:`run`), so the evaluation starts its worker processes and their imports once."""

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        self._embedder = create_embedder(name, **dict(options))

    def embed(self, texts: list[str]) -> FloatArray:
        return self._embedder.embed(texts)

    def calls(self) -> list[CallRow]:
        return embedder_calls(self._embedder)

    def run(self, fn: Callable[..., R], *args: Any) -> R:
        return fn(*args)


class RayEmbedder:
    """The embedder ``name`` run on Ray actors (see the module docstring).

    Args:
        ray: the ``ray`` module, initialised (:func:`spasm.raycluster.ray_session`).
        name: a registered embedder name.
        options: its options (``threads`` defaults to ``cpus_per_worker`` for ``local`` and
            ``static``).
        workers: how many actors (default: the cluster's CPUs over ``cpus_per_worker``).
        cpus_per_worker: CPUs Ray reserves for each actor.

    Attributes:
        workers: the actors' count.
        chunk_size: texts the pipeline should hand over per call (``TEXTS_PER_WORKER`` each).
    """

    def __init__(
        self,
        ray: Any,
        name: str,
        options: Mapping[str, Any] | None = None,
        *,
        workers: int | None = None,
        cpus_per_worker: float = 1.0,
    ) -> None:
        opts = dict(options or {})
        if name in ("local", "static"):
            opts.setdefault("threads", max(1, int(cpus_per_worker)))
        self.name: str = create_embedder(name, **opts).name  # a missing model fails here, at once
        self.workers = workers or _slots(ray, cpus_per_worker)
        self.chunk_size = TEXTS_PER_WORKER * self.workers
        self._ray = ray
        actor = ray.remote(num_cpus=cpus_per_worker)(_Worker)
        self._actors = [actor.remote(name, _worker_options(name, opts, i)) for i in range(self.workers)]

    @property
    def records(self) -> list[CallRow]:
        """The call-log rows of the requests the workers' embedders sent so far (the
        ``openai`` embedder's), worker by worker: the driver appends them to the run's
        ``calls`` table as a local run's (:func:`spasm.evaluation.embeddings.embedder_calls`)."""
        rows = gather(self._ray, [a.calls.remote() for a in self._actors], "embedding")
        return [r for part in rows for r in part]

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed ``texts`` on the actors, one contiguous slice of them (by length) each."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        parts = shards(len(texts), self.workers, order)
        refs = [a.embed.remote([texts[i] for i in p]) for a, p in zip(self._actors, parts, strict=False)]
        results = gather(self._ray, refs, "embedding")
        out = np.zeros((len(texts), results[0].shape[1]), dtype=np.float32)
        for part, vectors in zip(parts, results, strict=True):
            out[part] = vectors
        return out


def _worker_options(name: str, options: Mapping[str, Any], index: int) -> dict[str, Any]:
    """A worker's options: the ``openai`` embedder's call ids get the worker's number
    (``embed-<time>-w<index>:run#<seq>``), so those of two workers never collide."""
    if name != "openai" or "call_prefix" in options:
        return dict(options)
    return {**options, "call_prefix": embed_call_prefix(index)}


def _slots(ray: Any, cpus_per_worker: float) -> int:
    return max(1, int(float(ray.cluster_resources().get("CPU", 1)) // cpus_per_worker))


# The tasks' bodies: each imports the one stage it runs.

def _realism_task(convs: list[Conversation]) -> pd.DataFrame:
    from spasm.evaluation.realism import realism_frame

    return realism_frame(convs)


def _language_task(
    convs: list[Conversation], personas: Mapping[str, Persona]
) -> tuple[dict[str, dict[str, object]], list[LanguageFlag]]:
    from spasm.evaluation.language import language_rows

    return language_rows(convs, personas)


def _rule_task(convs: list[Conversation], vectors: Mapping[str, FloatArray],
               threshold: float) -> dict[str, EchoVerdict]:
    from spasm.evaluation.echoing import rule_echoing

    return {c.dialogue_id: rule_echoing(c, vectors[c.dialogue_id], threshold=threshold) for c in convs}


def _judge_task(
    convs: list[Conversation], rule: Mapping[str, EchoVerdict], backends: list[EvalBackend],
    max_tokens: int, calls: Any, concurrency: int,
) -> tuple[dict[str, EchoVerdict], dict[str, dict[str, EchoVerdict]], int, int, dict[str, CallScope]]:
    from spasm.evaluation.judges import echo_judges
    from spasm.evaluation.llm import EvalLLM

    with EvalLLM(calls.pass_id, backends, max_tokens=max_tokens, shard=calls) as llm:
        verdicts, by_judge, n_calls, fallbacks = echo_judges(
            llm, convs, rule, concurrency=concurrency, show=False)
        scopes = dict(llm.session.scopes)
    return verdicts, by_judge, n_calls, fallbacks, scopes


class _CacheServer:
    """The run's request cache (``cache.sqlite``) for the judge tasks: one actor on the
    driver's node, so every task reads and fills the same cache wherever it runs."""

    def __init__(self, path: str) -> None:
        from pathlib import Path

        from spasm.calls import Cache

        self._cache = Cache(Path(path))

    def get(self, key: str) -> Completion | None:
        return self._cache.get(key)

    def put(self, key: str, completion: Completion) -> None:
        self._cache.put(key, completion)


def _remote_cache(ray: Any, server: Any) -> Any:
    """A :class:`spasm.calls.Cache` whose entries live behind ``server`` (in a task)."""
    from spasm.calls import Cache

    class RemoteCache(Cache):
        def __init__(self) -> None:  # no file of its own: the server's
            pass

        def get(self, key: str) -> Completion | None:
            return ray.get(server.get.remote(key))  # type: ignore[no-any-return]

        def put(self, key: str, completion: Completion) -> None:
            ray.get(server.put.remote(key, completion))

        def close(self) -> None:
            pass

    return RemoteCache()


@dataclasses.dataclass
class _ShardCallsRef:
    """What a judge task gets for its :class:`~spasm.evaluation.llm.ShardCalls`: the cache
    as an actor handle, made into a cache in the task."""

    pass_id: str
    scopes: dict[str, CallScope]
    server: Any

    def calls(self) -> Any:
        from spasm.evaluation.llm import ShardCalls
        from spasm.raycluster import import_ray

        return ShardCalls(self.pass_id, self.scopes, _remote_cache(import_ray(), self.server))


def _warm_up() -> None:
    """The offline stages' imports (pandas, scipy, the language identifier), done while the
    driver still reads the run."""
    from spasm.evaluation import echoing, language, realism  # noqa: F401


class RayStages:
    """The per-dialogue stages on Ray over shards of the dialogues (module docstring).

    Each method returns what the local stage function returns for the whole list, merged from
    one task per shard: one contiguous shard of the run's dialogues per actor of ``embedder``,
    run by that actor (it holds its CPUs for the whole evaluation and is idle between
    embedding calls; the stages run one after another), so no other worker process starts.

    Args:
        embedder: the evaluation's :class:`RayEmbedder`, whose actors run the shards.
        show: a progress bar per stage, in dialogues, advanced as each shard finishes.
    """

    def __init__(self, embedder: RayEmbedder, *, show: bool = False) -> None:
        self._ray = embedder._ray
        self._actors = embedder._actors
        self.workers = embedder.workers
        self.show = show
        for actor in self._actors:  # queued behind the model's loading; not waited for
            actor.run.remote(_warm_up)

    def _map(self, fn: Callable[..., R], convs: list[Conversation], *shared: Any, desc: str,
             parts: int | None = None,
             per_shard: Callable[[list[Conversation]], tuple[Any, ...]] | None = None) -> list[R]:
        from tqdm import tqdm

        if not convs:
            return [fn(convs, *(per_shard([]) if per_shard else ()), *shared)]
        cut = [[convs[i] for i in p] for p in shards(len(convs), parts or self.workers)]
        common = [self._ray.put(x) for x in shared]  # once in the object store, not per task
        refs = [actor.run.remote(fn, part, *(per_shard(part) if per_shard else ()), *common)
                for actor, part in zip(self._actors, cut, strict=False)]
        with tqdm(total=len(convs), desc=f"{desc} (Ray, {len(cut)} shards)", unit="dlg",
                  disable=not self.show, leave=False, dynamic_ncols=True) as bar:
            return gather(self._ray, refs, desc, lambda i: bar.update(len(cut[i])))

    def realism_frame(self, convs: list[Conversation]) -> pd.DataFrame:
        """:func:`spasm.evaluation.realism.realism_frame` of ``convs``."""
        import pandas as pd

        frames = self._map(_realism_task, convs, desc="realism")
        return frames[0] if len(frames) == 1 else pd.concat(frames)

    def language_rows(
        self, convs: list[Conversation], personas: Mapping[str, Persona]
    ) -> tuple[dict[str, dict[str, object]], list[LanguageFlag]]:
        """:func:`spasm.evaluation.language.language_rows` of ``convs``."""
        rows: dict[str, dict[str, object]] = {}
        flags: list[LanguageFlag] = []
        for part_rows, part_flags in self._map(_language_task, convs, personas, desc="language"):
            rows.update(part_rows)
            flags.extend(part_flags)
        return rows, flags

    def rule_verdicts(self, convs: list[Conversation], vectors: Mapping[str, FloatArray],
                      threshold: float) -> dict[str, EchoVerdict]:
        """The echoing rule's verdict of each of ``convs`` (its utterances' ``vectors`` go to
        the shard that needs them, through the object store)."""
        out: dict[str, EchoVerdict] = {}
        for part in self._map(_rule_task, convs, threshold, desc="echoing signals",
                              per_shard=lambda p: ({c.dialogue_id: vectors[c.dialogue_id] for c in p},)):
            out.update(part)
        return out

    def echo_judges(
        self, llm: EvalLLM, convs: list[Conversation], rule: Mapping[str, EchoVerdict], *,
        concurrency: int,
    ) -> tuple[dict[str, EchoVerdict], dict[str, dict[str, EchoVerdict]], int, int]:
        """:func:`spasm.evaluation.judges.echo_judges` with ``llm``'s backends, on tasks.

        At most ``W`` tasks judge at once (the workers, never more than a backend's
        ``max_concurrency``, ``rpm`` or ``tpm``), each with ``1/W`` of every backend's limits
        and of ``concurrency``; their calls are ``llm``'s (one cache, one call log, one pass of
        call ids)."""
        from spasm.config import parallel_ways

        ways = parallel_ways([b.config for b in llm.backends], min(self.workers, max(1, len(convs))))
        backends = [dataclasses.replace(b, config=b.config.shared(ways)) for b in llm.backends]
        server = self._ray.remote(num_cpus=0)(_CacheServer).options(
            scheduling_strategy=_this_node(self._ray)).remote(str(llm.cache.path))

        def calls(part: list[Conversation]) -> tuple[Any, ...]:
            shard = llm.shard_calls(llm.cache, [c.dialogue_id for c in part])
            return ({c.dialogue_id: rule[c.dialogue_id] for c in part},
                    _ShardCallsRef(shard.pass_id, shard.scopes, server))

        try:
            results = self._map(_judge_shard, convs, backends, llm.max_tokens,
                                max(1, concurrency // ways), desc="judging echoing",
                                parts=ways, per_shard=calls)
        finally:
            self._ray.kill(server)
        verdicts: dict[str, EchoVerdict] = {}
        per_judge: dict[str, dict[str, EchoVerdict]] = {b.name: {} for b in llm.backends}
        n_calls = fallbacks = 0
        for part_verdicts, part_judges, part_calls, part_fallbacks, scopes in results:
            verdicts.update(part_verdicts)
            for name, judged in part_judges.items():
                per_judge[name].update(judged)
            n_calls += part_calls
            fallbacks += part_fallbacks
            llm.adopt(scopes)
        return verdicts, per_judge, n_calls, fallbacks


def _judge_shard(convs: list[Conversation], rule: Mapping[str, EchoVerdict], ref: _ShardCallsRef,
                 backends: list[EvalBackend], max_tokens: int, concurrency: int) -> Any:
    return _judge_task(convs, rule, backends, max_tokens, ref.calls(), concurrency)


def _this_node(ray: Any) -> Any:
    """A scheduling strategy that keeps an actor on the driver's node (hard affinity)."""
    strategies = ray.util.scheduling_strategies
    node = ray.get_runtime_context().get_node_id()
    return strategies.NodeAffinitySchedulingStrategy(node_id=node, soft=False)

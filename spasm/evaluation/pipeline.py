"""``evaluate``: run every metric on a run directory and write metrics.json and the report.

The stages are :data:`STAGES`, run in order on one :class:`EvalState`: embed every utterance
once; drift (cheap, or the LLM probe); the same on the Client's own content; echoing (the rule,
optionally the LLM judge) and its onset; persona separability per pairing × condition; realism
(lexical diversity and diagnostics, z-scored against ``reference``); people against the
simulator; language; the group detectors; payload leaks; the LLM-judged consistency and
simulator errors; the judges' ensemble; goals and pass^k. Then the paired comparison of every
metric across conditions, and the files.
The probe and the judge go through the engine's caller (:mod:`spasm.evaluation.llm`).
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from tqdm import tqdm

from spasm.config import BackendConfig
from spasm.dataset.columns import PersonaProbe, load_persona_probes
from spasm.dataset.files import atomic_write_table, atomic_write_text
from spasm.dataset.lock import RunLock
from spasm.dataset.outputs import check_output, mark_output
from spasm.dataset.reader import open_run
from spasm.errors import UserError
from spasm.evaluation.agreement import human_agreement
from spasm.evaluation.compare import Comparison, compare_conditions, write_comparison
from spasm.evaluation.consistency import ConsistencyVerdict
from spasm.evaluation.drift import (
    DRIFT_DIMENSIONS,
    PERSONA_DIMENSIONS,
    UTTERANCE_DIMENSION,
    DriftSeries,
    cheap_drift,
    condition_summaries,
    dialogue_means,
    drift_column,
    drift_curves,
    paired_comparisons,
    probe_drift,
    references,
)
from spasm.evaluation.echoing import DEFAULT_THRESHOLD, EchoVerdict, rule_echoing
from spasm.evaluation.embeddings import (
    CachedEmbedder,
    Embedder,
    FloatArray,
    create_embedder,
    embedder_calls,
    l2_normalise,
)
from spasm.evaluation.figures import write_figures
from spasm.evaluation.goals import goal_metrics
from spasm.evaluation.group import GroupResult, group_stage, two_party_note
from spasm.evaluation.human import human_stage
from spasm.evaluation.judges import consistency_stage, echo_judges, ensemble_report
from spasm.evaluation.language import language_metrics, language_scan
from spasm.evaluation.leaks import leak_stage
from spasm.evaluation.llm import DEFAULT_MAX_TOKENS, EvalBackend, EvalLLM, log_calls, resolve_backend
from spasm.evaluation.loader import Conversation, RunData, load_run
from spasm.evaluation.metrics import (
    Counts,
    DriftMetrics,
    EchoingMetrics,
    Metrics,
    OwnDrift,
    RealismMetrics,
    SeparabilityGroup,
)
from spasm.evaluation.onset import onset_curves, onset_turn, turn_scores
from spasm.evaluation.owncontent import (
    OWN_SUFFIX,
    OwnContent,
    OwnRule,
    own_column,
    own_content,
    own_conversations,
    own_metrics,
    own_texts,
    own_vectors,
    per_turn_frame,
)
from spasm.evaluation.realism import realism_frame, realism_metrics, reference_from, z_scores
from spasm.evaluation.reliability import reliability_metrics
from spasm.evaluation.report import report_figures, write_report
from spasm.evaluation.report_group import GroupFrames
from spasm.evaluation.separability import Retrieval, separability_scores
from spasm.evaluation.simulator import simulator_stage
from spasm.evaluation.stats import finite
from spasm.evaluation.summary import (
    echo_examples,
    echo_rate,
    echo_rates,
    group_key,
    kappa,
)
from spasm.personas.persona import Persona

if TYPE_CHECKING:
    from spasm.evaluation.distributed import RayStages

__all__ = ["EVAL_DIRNAME", "STAGES", "EvalState", "Stage", "evaluate", "load_metrics", "load_per_dialogue"]

EVAL_DIRNAME = "eval"
METRICS_FILE = "metrics.json"
PER_DIALOGUE_FILE = "per_dialogue.parquet"
#: Group runs only: one row per (dialogue, participant) of the group detectors.
PER_PARTICIPANT_FILE = "per_participant.parquet"
#: Group runs only: one row per (dialogue, ordered pair of participants) of pairwise echoing.
PER_PAIR_FILE = "per_pair.parquet"
#: One row per client-side utterance: its copied share and own content (docs/evaluation.md).
PER_TURN_FILE = "per_turn.parquet"
COMPARE_FILE = "compare.json"
REPORT_FILE = "report.html"
CACHE_DIRNAME = "embeddings-cache"

Embed = Callable[..., FloatArray]


def _bar(total: int | None, desc: str, enabled: bool, unit: str = "it") -> tqdm[Any]:
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False, dynamic_ncols=True)


@dataclass
class _Vectors:
    """Every utterance embedded once; drift, echoing and separability all reuse these."""

    utterances: dict[str, FloatArray]
    client: dict[str, FloatArray]
    n_texts: int


def evaluate(
    run_dir: str | Path,
    *,
    embedder: str | Embedder = "local",
    embedder_options: Mapping[str, Any] | None = None,
    mode: Literal["cheap", "probe"] = "cheap",
    judge: bool = False,
    consistency: bool = False,
    judges: Sequence[str] = (),
    llm_backend: str | None = None,
    llm_config: BackendConfig | None = None,
    llm_max_tokens: int = DEFAULT_MAX_TOKENS,
    retrieval: Retrieval = "card",
    echo_threshold: float = DEFAULT_THRESHOLD,
    reference: str | Path | None = None,
    baseline: str | None = None,
    own_ngram: int = OwnRule.ngram,
    own_min_words: int = OwnRule.min_words,
    own_consistency: bool = False,
    out_dir: str | Path | None = None,
    concurrency: int = 8,
    progress: bool | None = None,
    write: bool = True,
    overwrite: bool = False,
    simulator_errors: bool = False,
    distributed: RayStages | None = None,
) -> Metrics:
    """Compute drift, echoing and persona separability for a run directory.

    Args:
        run_dir: a directory with personas/dialogues/turns Parquet tables.
        embedder: a registered embedder name (``"local"``, ``"openai"``, ...) or an object.
        embedder_options: keyword options for :func:`create_embedder` (e.g. ``model``,
            ``base_url``, ``api_key_env`` for ``"openai"``).
        mode: ``"cheap"`` (utterances as stances) or ``"probe"`` (an LLM states them).
        judge: decide echoing with the LLM judge (falls back to the rule per conversation).
        consistency: judge persona consistency (prompt-to-line, line-to-line) with the LLM.
        judges: several judge backends (names of the run's ``config.json`` backends, or
            ``"embedded"``) for every LLM-judged metric, after the one ``llm_backend`` /
            ``llm_config`` names; each one's result, their agreement and disagreements go to
            ``metrics.judges``. Alone it turns on ``judge``.
        llm_backend: for probe mode and the judge, a backend of the run's ``config.json`` by
            name, or ``"embedded"``; default: the run's first pairing's client backend (a
            group run's first client seat's).
        llm_config: an explicit backend instead (e.g. ``BackendConfig(kind="openai", ...)``),
            named ``llm_backend`` or ``"eval"``.
        llm_max_tokens: cap on each probe/judge reply.
        retrieval: Acc@K against persona ``"card"`` embeddings or leave-one-out ``"centroid"``.
        echo_threshold: side score at which the rule flags echoing.
        reference: another run directory or imported dataset (e.g. a human corpus) whose
            dialogues the realism metrics are z-scored against.
        baseline: the condition every other one is compared with in ``compare.json``
            (default ``ecp`` when the run has it).
        own_ngram: own content: a Client word is copied when it lies in a run of at least this
            many words an earlier utterance of the dialogue contains (docs/evaluation.md).
        own_min_words: own content: an utterance something was cut from is left out when it
            keeps fewer words than this.
        own_consistency: with ``consistency``, also judge prompt-to-line on the Client's own
            content (one more call per dialogue whose Client copied; off by default, so the
            judge's calls and cost stay as they were).
        out_dir: where to write metrics.json, per_dialogue.parquet, report.html and its figures.json
            (default ``RUN_DIR/eval``). The embedding cache always lives in ``RUN_DIR/eval``.
        concurrency: dialogues whose LLM calls are in flight at once (probe and judge).
        simulator_errors: review the simulated user's errors with the LLM judge (τ²'s user
            tags and severities; :mod:`spasm.evaluation.simulator`).
        progress: show progress bars (default: when stderr is a terminal).
        distributed: run realism, the language scan, the echoing rule and the echoing judge on
            a Ray cluster, over shards of the dialogues (``spasm eval --ray``:
            :class:`spasm.evaluation.distributed.RayStages`); the files are a local run's.
        write: write the files (``False``: only return the metrics). The probe's and the
            judge's calls are appended to the run's ``calls`` table either way, and cached in
            its ``cache.sqlite``; so are an embedder's requests (the ``openai`` embedder's,
            role ``eval_embed``: texts its embedding cache answers send none).
        overwrite: replace an earlier evaluation at an ``out_dir`` outside the run (one inside
            the run, such as the default, is always replaced); ``out_dir`` is never inside
            another run.

    Runs its own event loop for the LLM stages; from async code call it in a worker
    thread (``await anyio.to_thread.run_sync(functools.partial(evaluate, ...))``).

    Raises:
        UserError: bad arguments, no backend for the LLM stages, or a run directory without
            the needed tables.
    """
    if mode not in ("cheap", "probe"):
        raise UserError(f"Unknown drift mode {mode!r}; use 'cheap' or 'probe'.")
    if retrieval not in ("card", "centroid"):
        raise UserError(f"Unknown retrieval {retrieval!r}; use 'card' or 'centroid'.")
    if concurrency < 1:
        raise UserError("concurrency must be at least 1.")
    if own_ngram < 2 or own_min_words < 1:
        raise UserError("own content needs --own-ngram of at least 2 and --own-min-words of at least 1.")
    own_rule = OwnRule(ngram=own_ngram, min_words=own_min_words)
    show = sys.stderr.isatty() if progress is None else progress
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / EVAL_DIRNAME
    if write:  # before any work: never into a run's tables, over a run or another's output
        own = out.resolve().is_relative_to(run_dir.resolve())
        check_output(out, "eval", overwrite=overwrite or own, source=run_dir)
    if reference is not None and not Path(reference).is_dir():
        raise UserError(f"Reference {reference} is not a directory; give a run or an imported dataset.")
    llm_cm: AbstractContextManager[EvalLLM | None] = nullcontext()
    judges = list(judges)
    judge = judge or (bool(judges) and not consistency)
    uses_llm = mode == "probe" or judge or consistency or simulator_errors
    # Writing eval/ into the run, or appending its LLM calls to the run's call log, is writing
    # the run: one writer at a time (a run that generate holds is refused, naming its process).
    into_run = write and out.resolve().is_relative_to(run_dir.resolve())
    lock: AbstractContextManager[object] = (
        RunLock(run_dir) if (into_run or uses_llm) and run_dir.is_dir() else nullcontext())
    with lock:
        if uses_llm:
            choice = _llm_backends(run_dir, llm_backend, llm_config, judges)
            data = load_run(run_dir)  # a run without tables fails before the cache is created
            _check_baseline(data, baseline)
            llm_cm = EvalLLM(run_dir, choice, max_tokens=llm_max_tokens, locked=True)
        else:
            data = load_run(run_dir)
            _check_baseline(data, baseline)
        timings["load"] = time.perf_counter() - t_start
        with llm_cm as llm:  # on exit, the LLM calls are appended to the run's call log
            inner = (create_embedder(embedder, **dict(embedder_options or {}))
                     if isinstance(embedder, str) else embedder)
            sent = len(embedder_calls(inner))  # an embedder object's rows of earlier evaluations
            try:
                metrics, per_dialogue, group, per_turn = _evaluate(
                    data, inner, mode=mode, judge=judge, llm=llm,
                    retrieval=retrieval, echo_threshold=echo_threshold, concurrency=concurrency,
                    show=show, timings=timings, reference=reference, consistency=consistency,
                    ensemble=bool(judges), simulator_errors=simulator_errors, own_rule=own_rule,
                    own_consistency=own_consistency, distributed=distributed,
                )
            finally:  # its requests were sent, whatever failed later: logged like the LLM's
                log_calls(run_dir, "eval-embed", embedder_calls(inner)[sent:],
                          locked=isinstance(lock, RunLock))
        t0 = time.perf_counter()
        comparison = compare_conditions(per_dialogue, metrics, baseline=baseline, run_dir=data.run_dir)
        timings["compare"] = time.perf_counter() - t0
        timings["total"] = time.perf_counter() - t_start
        metrics.timings = {k: round(v, 3) for k, v in timings.items()}
        if write:
            t0 = time.perf_counter()
            mark_output(out, "eval")
            atomic_write_text(out / METRICS_FILE, metrics.model_dump_json(indent=2))
            atomic_write_table(out / PER_DIALOGUE_FILE,
                               pa.Table.from_pandas(per_dialogue, preserve_index=False))
            atomic_write_table(out / PER_TURN_FILE, pa.Table.from_pandas(per_turn, preserve_index=False))
            group_tables = {PER_PARTICIPANT_FILE: group.per_participant if group else None,
                            PER_PAIR_FILE: group.per_pair if group else None}
            for name, table in group_tables.items():
                if table is not None:
                    atomic_write_table(out / name, pa.Table.from_pandas(table, preserve_index=False))
                else:  # a stale file of an earlier evaluation must not describe this run
                    (out / name).unlink(missing_ok=True)
            write_comparison(comparison, out / COMPARE_FILE)
            frames = None if group is None else GroupFrames(group.per_participant, group.per_pair)
            figures = report_figures(metrics, per_dialogue, comparison, frames)
            write_figures(out, figures)  # the same figures as data, for the viewer
            write_report(metrics, per_dialogue, out / REPORT_FILE, figures, comparison, frames)
            metrics.timings["report"] = round(time.perf_counter() - t0, 3)
            atomic_write_text(out / METRICS_FILE, metrics.model_dump_json(indent=2))
    return metrics


def _llm_backends(
    run_dir: Path, name: str | None, config: BackendConfig | None, judges: Sequence[str]
) -> list[EvalBackend]:
    """The evaluation's LLM backends: the one the flags name (or the run's own), then ``judges``."""
    if not judges:
        return [resolve_backend(run_dir, name=name, config=config)]
    first = [resolve_backend(run_dir, name=name, config=config)] if name or config else []
    return first + [resolve_backend(run_dir, name=j) for j in judges]


def _persona_probes(data: RunData) -> dict[tuple[str, str], list[PersonaProbe]]:
    """The persona probes (``harness.persona_probes``) of each ``(dialogue_id, speaker)`` that
    has them — the Client of a two-party dialogue, each client seat of a group one; speakers in
    lower case, as the loader reads them — from the turns' ``probe`` column (empty for a run
    without them). Only client turns hold them."""
    turns = data.turns
    if "probe" not in turns.columns:
        return {}
    out: dict[tuple[str, str], list[PersonaProbe]] = {}
    held = turns[turns["probe"].notna()]
    for did, speaker, raw in zip(held["dialogue_id"], held["speaker"], held["probe"], strict=True):
        asked = load_persona_probes(raw)
        if asked:
            out.setdefault((str(did), str(speaker)), []).extend(asked)
    return out


def _check_baseline(data: RunData, baseline: str | None) -> None:
    conditions = sorted({c.condition for c in data.conversations})
    if baseline is not None and baseline not in conditions:
        raise UserError(
            f"--baseline {baseline!r} is not a condition of this run; it has: "
            + (", ".join(conditions) or "none")
            + "."
        )


@dataclass
class EvalState:
    """What the stages share: the run, the options and the embedder, then what each stage
    leaves for the later ones (its attributes below), for metrics.json (``fields``: values of
    :class:`Metrics` fields, by name) and for per_dialogue.parquet (``columns``, joined by
    :meth:`add_columns`, in stage order, after the fixed columns of :func:`_per_dialogue`)."""

    data: RunData
    embed: Embed
    mode: Literal["cheap", "probe"]
    judge: bool
    llm: EvalLLM | None
    retrieval: Retrieval
    echo_threshold: float
    concurrency: int
    show: bool
    reference: str | Path | None
    consistency: bool
    ensemble: bool
    simulator_errors: bool
    own_rule: OwnRule | None
    own_consistency: bool
    #: ``spasm eval --ray``: the per-dialogue stages that have a Ray form run on it.
    distributed: RayStages | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    columns: pd.DataFrame | None = None
    # Set by the stages, in order (reading one before its stage ran is an AttributeError).
    personas: dict[str, Persona] = field(init=False)
    vectors: _Vectors = field(init=False)
    means: dict[str, dict[str, float]] = field(init=False)
    series: DriftSeries = field(init=False)
    own: OwnContent = field(init=False)
    client_own: dict[str, FloatArray] = field(init=False)
    own_means: dict[str, dict[str, float]] = field(init=False)
    own_series: DriftSeries = field(init=False)
    verdicts: dict[str, EchoVerdict] = field(init=False)
    echo_by_judge: dict[str, dict[str, EchoVerdict]] = field(init=False)
    pca_xy: dict[str, tuple[float, float]] = field(init=False)
    persona_cols: dict[str, dict[str, float]] = field(init=False)
    persona_own: dict[str, dict[str, float]] = field(init=False)
    group: GroupResult | None = None
    consistency_by_judge: dict[str, dict[str, ConsistencyVerdict]] | None = None

    @property
    def convs(self) -> list[Conversation]:
        return self.data.conversations

    @property
    def two_party(self) -> list[Conversation]:
        """Drift, echoing and separability are two-party measures; group dialogues get the
        group stage's per-seat and per-pair forms instead (docs/evaluation.md, "Group dialogues")."""
        return [c for c in self.convs if not c.is_group]

    def add_columns(self, frame: pd.DataFrame) -> None:
        """Join per-dialogue columns (indexed by dialogue id) to those of the earlier stages."""
        self.columns = frame if self.columns is None else self.columns.join(frame)


@dataclass(frozen=True)
class Stage:
    """One step of :func:`evaluate`: ``name`` is its key in ``metrics.timings``; ``run`` does
    the work on the shared :class:`EvalState` and says whether its time goes into ``timings``
    (``False``: it had nothing to measure in this run, or only summarises other stages)."""

    name: str
    run: Callable[[EvalState], bool]


def _embed_stage(s: EvalState) -> bool:
    s.vectors = _embed_utterances(s.convs, s.embed)
    return True


def _drift_stage(s: EvalState) -> bool:
    s.personas = s.data.by_id
    two_party = s.two_party
    drift, s.means, s.series = _drift(two_party, s.vectors, s.personas, s.embed, s.mode, s.llm,
                                      s.concurrency, s.show)
    if len(two_party) < len(s.convs):
        drift.notes = [*(drift.notes if two_party else []),
                       two_party_note(len(s.convs) - len(two_party), len(two_party))]
    s.fields["drift"] = drift
    return True


def _own_content_stage(s: EvalState) -> bool:
    """Own content: every persona metric again on what the Client wrote itself (owncontent.py)."""
    two_party = s.two_party
    s.own = own_content(s.convs, s.own_rule)
    s.client_own = own_vectors(s.own, {c.dialogue_id: s.vectors.client[c.dialogue_id] for c in two_party},
                               s.embed)
    drift: DriftMetrics = s.fields["drift"]
    drift.own, s.own_means, s.own_series = _own_drift(two_party, s.client_own, s.personas, s.embed,
                                                      s.mode, drift)
    s.fields["own_content"] = own_metrics(s.own, s.convs)
    return True


def _echoing_stage(s: EvalState) -> bool:
    s.fields["echoing"], s.verdicts, s.echo_by_judge = _echoing(
        s.data.run_dir, s.two_party, s.vectors, s.echo_threshold, s.llm if s.judge else None,
        s.concurrency, s.show, s.distributed)
    return True


def _separability_stage(s: EvalState) -> bool:
    s.fields["separability"], s.pca_xy, s.persona_cols = _separability(
        s.data, s.personas, s.vectors, s.embed, s.retrieval)
    kept_own = {did: v[np.isfinite(v).all(axis=1)] for did, v in s.client_own.items()}
    s.fields["separability_own"], _, s.persona_own = _separability(
        s.data, s.personas, _Vectors(s.vectors.utterances, kept_own, s.vectors.n_texts), s.embed,
        s.retrieval, suffix=OWN_SUFFIX)
    return True


def _realism_stage(s: EvalState) -> bool:
    s.fields["realism"], frame = _realism(s.convs, s.reference, s.distributed)
    s.add_columns(frame)
    return True


def _human_stage(s: EvalState) -> bool:
    """People in seats: their dialogues against the simulator's (runs or references with people)."""
    assert s.columns is not None  # the realism stage's
    s.fields["human"] = human_stage(s.data, s.columns, s.reference, s.embed)
    return s.fields["human"] is not None


def _language_stage(s: EvalState) -> bool:
    if s.distributed is None:
        s.fields["language"], language_cols = language_scan(s.convs, s.personas)
    else:
        language_cols, flags = s.distributed.language_rows(s.convs, s.personas)
        s.fields["language"] = language_metrics(s.convs, language_cols, flags)
    s.add_columns(pd.DataFrame.from_dict(language_cols, orient="index"))
    return True


def _group_stage(s: EvalState) -> bool:
    s.group = group_stage(s.data.run_dir, s.convs, s.personas, s.embed,
                          own=own_texts(s.own, (c for c in s.convs if c.is_group)))
    s.fields["group"] = s.group.metrics if s.group is not None else None
    return s.group is not None


def _payload_leak_stage(s: EvalState) -> bool:
    leak, leak_cols = leak_stage(open_run(s.data.run_dir, verify=False), s.convs)
    s.fields["payload_leak"] = leak
    if leak is None:
        return False
    s.add_columns(pd.DataFrame.from_dict(leak_cols, orient="index"))  # a run with tools
    return True


def _consistency_stage(s: EvalState) -> bool:
    if not s.consistency or s.llm is None:
        return False
    cards = {pid: p.card for pid, p in s.personas.items()}
    s.fields["consistency"], scores, s.consistency_by_judge = consistency_stage(
        s.llm, s.convs, cards, concurrency=s.concurrency, show=s.show, qa=_persona_probes(s.data),
        own=own_conversations(s.own, s.convs) if s.own_consistency else None,
    )
    s.add_columns(pd.DataFrame.from_dict(scores, orient="index", dtype=float))
    return True


def _simulator_errors_stage(s: EvalState) -> bool:
    """The simulated user's own errors (opt-in)."""
    if not s.simulator_errors or s.llm is None:
        return False
    s.fields["simulator_errors"], sim_cols = simulator_stage(
        s.llm, s.data.run_dir, s.data.dialogues, s.convs, concurrency=s.concurrency, show=s.show)
    s.add_columns(pd.DataFrame.from_dict(sim_cols, orient="index"))
    return True


def _judges_stage(s: EvalState) -> bool:
    """The judge ensemble's report: a summary of the echoing and consistency judges' calls
    (their time is theirs)."""
    if s.ensemble and s.llm is not None:
        s.fields["judges"] = ensemble_report(s.llm, s.echo_by_judge if s.judge else None,
                                             s.consistency_by_judge)
    return False


def _outcomes_stage(s: EvalState) -> bool:
    """Goal success (runs with scenarios) and pass^k (runs with trials): read off the
    dialogues, not timed."""
    s.fields["goals"] = goal_metrics(s.convs)
    s.fields["reliability"] = reliability_metrics(s.convs)
    return False


#: The stages of :func:`evaluate`, in the order they run (a later one reads what earlier ones
#: left in the :class:`EvalState`). A metric adds its stage here (docs/architecture.md).
STAGES: list[Stage] = [
    Stage("embed_utterances", _embed_stage),
    Stage("drift", _drift_stage),
    Stage("own_content", _own_content_stage),
    Stage("echoing", _echoing_stage),
    Stage("separability", _separability_stage),
    Stage("realism", _realism_stage),
    Stage("human", _human_stage),
    Stage("language", _language_stage),
    Stage("group", _group_stage),
    Stage("payload_leak", _payload_leak_stage),
    Stage("consistency", _consistency_stage),
    Stage("simulator_errors", _simulator_errors_stage),
    Stage("judges", _judges_stage),
    Stage("outcomes", _outcomes_stage),
]


def _evaluate(
    data: RunData,
    inner: Embedder,
    *,
    mode: Literal["cheap", "probe"],
    judge: bool,
    llm: EvalLLM | None,
    retrieval: Retrieval,
    echo_threshold: float,
    concurrency: int,
    show: bool,
    timings: dict[str, float],
    reference: str | Path | None = None,
    consistency: bool = False,
    ensemble: bool = False,
    simulator_errors: bool = False,
    own_rule: OwnRule | None = None,
    own_consistency: bool = False,
    distributed: RayStages | None = None,
) -> tuple[Metrics, pd.DataFrame, GroupResult | None, pd.DataFrame]:
    """The :data:`STAGES`, each timed; see :func:`evaluate`. The third value: the group
    detectors' result (group runs only); the fourth: ``per_turn.parquet`` (own content per
    client utterance)."""
    convs = data.conversations
    # An embedder on many workers (spasm eval --ray) takes more texts per call.
    cached = CachedEmbedder(inner, data.run_dir / EVAL_DIRNAME / CACHE_DIRNAME,
                            chunk_size=int(getattr(inner, "chunk_size", 1024)))

    def embed(texts: list[str], desc: str = "embedding") -> FloatArray:
        # Counted in sentences: the bar shows sentences/s and the time left.
        with _bar(cached.count_missing(texts), desc, show, unit="sentences") as bar:
            cached.progress = bar.update
            try:
                return cached.embed(texts)
            finally:
                cached.progress = None

    state = EvalState(
        data=data, embed=embed, mode=mode, judge=judge, llm=llm, retrieval=retrieval,
        echo_threshold=echo_threshold, concurrency=concurrency, show=show, reference=reference,
        consistency=consistency, ensemble=ensemble, simulator_errors=simulator_errors,
        own_rule=own_rule, own_consistency=own_consistency, distributed=distributed,
    )
    for stage in STAGES:
        t0 = time.perf_counter()
        if stage.run(state):
            timings[stage.name] = time.perf_counter() - t0

    counts = Counts(
        personas=len(data.by_id),
        dialogues_total=data.n_dialogues_total,
        dialogues_ok=len(convs),
        utterances=state.vectors.n_texts,
        client_turns=sum(c.sides.count("client") for c in convs),
        texts_embedded=cached.computed,
        texts_cached=cached.hits,
    )
    metrics = Metrics(
        run_dir=str(data.run_dir),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        embedder=inner.name,
        mode=mode,
        judge=judge,
        counts=counts,
        llm=llm.usage() if llm is not None else None,
        timings={},
        **state.fields,
    )
    frame = _per_dialogue(convs, state.means, state.verdicts, state.pca_xy, state.columns, echo_threshold)
    if "dialogue_id" in frame:  # a run without an ok dialogue has an empty frame
        frame = frame.join(_own_columns(convs, state.own_means, state.persona_cols, state.persona_own),
                           on="dialogue_id")
    per_turn = per_turn_frame(state.own, convs, state.series, state.own_series)
    group = state.group
    if group is None:
        return metrics, frame, None, per_turn
    # Group runs: the group_* columns (and persona_set, the pairing key of group twins).
    frame = frame.join(group.per_dialogue, on="dialogue_id")
    return metrics, frame, group, per_turn


def _embed_utterances(convs: list[Conversation], embed: Embed) -> _Vectors:
    all_texts = [t for c in convs for t in c.texts]
    matrix = embed(all_texts, "embedding utterances") if all_texts else np.zeros((0, 1), np.float32)
    utt: dict[str, FloatArray] = {}
    client: dict[str, FloatArray] = {}
    row = 0
    for c in convs:
        utt[c.dialogue_id] = matrix[row : row + len(c.texts)]
        row += len(c.texts)
        mask = np.array([s == "client" for s in c.speakers], dtype=bool)
        client[c.dialogue_id] = utt[c.dialogue_id][mask]
    return _Vectors(utt, client, len(all_texts))


def _drift(
    convs: list[Conversation],
    vectors: _Vectors,
    personas: Mapping[str, Persona],
    embed: Embed,
    mode: Literal["cheap", "probe"],
    llm: EvalLLM | None,
    concurrency: int,
    show: bool,
) -> tuple[DriftMetrics, dict[str, dict[str, float]], DriftSeries]:
    probe_calls = probe_fallbacks = 0
    n_client = sum(len(v) for v in vectors.client.values())
    if mode == "cheap":
        series: DriftSeries = cheap_drift(convs, vectors.client, personas, embed)
    else:
        assert llm is not None
        with _bar(n_client, "probing stances", show) as bar:
            series, probe_calls, probe_fallbacks = llm.run(
                functools.partial(
                    probe_drift, convs, vectors.client, embed, concurrency=concurrency, on_done=bar.update
                ),
            )
    means = dialogue_means(series)
    notes: list[str] = []
    conditions = {c.condition for c in convs}
    comparisons = paired_comparisons(means, convs)
    if not {"ecp", "concat"} <= conditions:
        notes.append(
            "ECP vs CONCAT needs both conditions in the run; found: "
            + (", ".join(sorted(conditions)) or "none")
            + "."
        )
        comparisons = []
    elif all(c.n_pairs == 0 for c in comparisons):
        notes.append(
            "No ECP dialogue has a CONCAT twin with the same persona, conversation index, "
            "pairing and harness level, so ECP vs CONCAT cannot be paired."
        )
        comparisons = []
    missing = [d for d in PERSONA_DIMENSIONS
               if series and all(not np.isfinite(s[d]).any() for s in series.values())]
    if missing and mode == "cheap":
        notes.append(
            "No persona field for: " + ", ".join(missing) + " (the personas table lacks it), "
            "so those curves are empty."
        )
    if n_client and probe_fallbacks == n_client:
        notes.append(
            "Every probe fell back to the utterance (no reply validated or every call "
            "failed): the persona dimensions repeat the utterance curve. See calls.parquet."
        )
    drift = DriftMetrics(
        mode=mode,
        dimensions=list(DRIFT_DIMENSIONS),
        references=references(mode),
        curves=drift_curves(series, convs),
        by_condition=condition_summaries(means, convs),
        comparisons=comparisons,
        probe_calls=probe_calls,
        probe_fallbacks=probe_fallbacks,
        notes=notes,
    )
    return drift, means, series


def _own_drift(
    convs: list[Conversation],
    client_own: dict[str, FloatArray],
    personas: Mapping[str, Persona],
    embed: Embed,
    mode: Literal["cheap", "probe"],
    raw: DriftMetrics,
) -> tuple[OwnDrift, dict[str, dict[str, float]], DriftSeries]:
    """Cheap drift on the Client's own content (left-out utterances are NaN rows, so their
    turns are missing); in probe mode the utterance dimension only (the probe reads the
    transcript, not one utterance)."""
    series = cheap_drift(convs, client_own, personas, embed)
    notes: list[str] = []
    if mode == "probe":
        series = {did: {UTTERANCE_DIMENSION: dims[UTTERANCE_DIMENSION]} for did, dims in series.items()}
        notes.append("Probe mode: own content is measured on the utterance dimension only (the probe "
                     "states a stance from the whole transcript, which copying is part of).")
    means = dialogue_means(series)
    lost = sum(1 for c in convs if c.dialogue_id in series
               and not np.isfinite(series[c.dialogue_id][UTTERANCE_DIMENSION]).any())
    if lost:
        notes.append(f"{lost} dialogue(s) have no utterance drift on own content: the Client's "
                     "opening was left out (too few words of its own).")
    dims = [UTTERANCE_DIMENSION] if mode == "probe" else list(raw.dimensions)
    return OwnDrift(
        dimensions=dims,
        curves=drift_curves(series, convs),
        by_condition=condition_summaries(means, convs),
        comparisons=paired_comparisons(means, convs) if raw.comparisons else [],
        notes=notes,
    ), means, series


def _own_columns(
    convs: list[Conversation],
    own_means: Mapping[str, Mapping[str, float]],
    separability: Mapping[str, Mapping[str, float]],
    separability_own: Mapping[str, Mapping[str, float]],
) -> pd.DataFrame:
    """``drift_<dimension>_own`` per dialogue (NaN for a group dialogue: its seats have
    ``group_drift_<dimension>_own``), and the per-dialogue separability columns raw and on own
    content (``persona_hit_at_1``, ``persona_silhouette``, ``…_own``; NaN where undefined)."""
    columns = [*(own_column(drift_column(d)) for d in DRIFT_DIMENSIONS),
               *(f"persona_{m}{s}" for m in ("hit_at_1", "silhouette") for s in ("", OWN_SUFFIX))]
    rows = {}
    for c in convs:
        row = {own_column(drift_column(d)): own_means.get(c.dialogue_id, {}).get(d, math.nan)
               for d in DRIFT_DIMENSIONS}
        row.update(separability.get(c.dialogue_id, {}))
        row.update(separability_own.get(c.dialogue_id, {}))
        rows[c.dialogue_id] = row
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns, dtype=float)


def _echoing(
    run_dir: Path,
    convs: list[Conversation],
    vectors: _Vectors,
    threshold: float,
    llm: EvalLLM | None,
    concurrency: int,
    show: bool,
    distributed: RayStages | None = None,
) -> tuple[EchoingMetrics, dict[str, EchoVerdict], dict[str, dict[str, EchoVerdict]]]:
    """The rule on every conversation; with ``llm``, the judge's (or the judges' majority)
    verdicts over it, and each judge's."""
    if distributed is not None:
        rule = distributed.rule_verdicts(convs, vectors.utterances, threshold)
    else:
        rule = {
            c.dialogue_id: rule_echoing(c, vectors.utterances[c.dialogue_id], threshold=threshold)
            for c in tqdm(convs, desc="echoing signals", disable=not show, leave=False)
        }
    verdicts: dict[str, EchoVerdict] = rule
    judge_calls = judge_fallbacks = 0
    kappa_rule_judge: float | None = None
    by_judge: dict[str, dict[str, EchoVerdict]] = {}
    if llm is not None:
        verdicts, by_judge, judge_calls, judge_fallbacks = (
            echo_judges(llm, convs, rule, concurrency=concurrency, show=show) if distributed is None
            else distributed.echo_judges(llm, convs, rule, concurrency=concurrency))
        kappa_rule_judge = kappa(
            [rule[c.dialogue_id].echoing for c in convs],
            [verdicts[c.dialogue_id].echoing for c in convs],
        )
    kappa_human, human_note = human_agreement(run_dir, rule, verdicts if llm is not None else None)
    onsets = {c.dialogue_id: onset_turn(verdicts[c.dialogue_id], threshold) for c in convs}
    metrics = EchoingMetrics(
        method="judge" if llm is not None else "rule",
        threshold=threshold,
        rates=echo_rates(convs, verdicts),
        overall=echo_rate("all", "all", convs, verdicts),
        examples=echo_examples(convs, verdicts),
        judge_calls=judge_calls,
        judge_fallbacks=judge_fallbacks,
        kappa_rule_vs_judge=kappa_rule_judge,
        kappa_human=kappa_human,
        human_note=human_note,
        onset=onset_curves(convs, onsets),
    )
    return metrics, verdicts, by_judge


def _realism(
    convs: list[Conversation], reference: str | Path | None, distributed: RayStages | None = None
) -> tuple[RealismMetrics, pd.DataFrame]:
    """Lexical diversity and diagnostics per dialogue, z-scored against ``reference``."""
    frame = realism_frame(convs) if distributed is None else distributed.realism_frame(convs)
    ref = reference_from(reference) if reference is not None else None
    if ref is not None:
        frame = frame.join(z_scores(frame, ref.stats))
    return realism_metrics(frame, convs, ref), frame


def _separability(
    data: RunData,
    personas: Mapping[str, Persona],
    vectors: _Vectors,
    embed: Embed,
    retrieval: Retrieval,
    suffix: str = "",
) -> tuple[list[SeparabilityGroup], dict[str, tuple[float, float]], dict[str, dict[str, float]]]:
    """Separability per pairing × condition, each conversation's PCA coordinates (none with a
    ``suffix``: the own-content pass), and its per-dialogue columns ``persona_hit_at_1`` (its
    persona ranked first: the group's Acc@1 is their mean) and ``persona_silhouette`` (its
    silhouette value: the group's silhouette is their mean), named with ``suffix``."""
    conv_vec = {did: l2_normalise(v.mean(axis=0))[0] for did, v in vectors.client.items() if len(v)}
    card_vecs, card_note = _card_vectors(data, personas, embed, retrieval)
    groups: dict[tuple[str, str], list[Conversation]] = defaultdict(list)
    for c in data.conversations:
        if c.dialogue_id in conv_vec and not c.is_group:
            groups[(c.pairing, c.condition)].append(c)
    out: list[SeparabilityGroup] = []
    pca_xy: dict[str, tuple[float, float]] = {}
    per_dialogue: dict[str, dict[str, float]] = {}
    for (pairing, condition), members in sorted(groups.items(), key=group_key):
        x = np.stack([conv_vec[c.dialogue_id] for c in members])
        labels = [c.persona_id for c in members]
        use = retrieval if card_vecs is not None or retrieval == "centroid" else "centroid"
        scores = separability_scores(x, labels, retrieval=use, cards=card_vecs)
        notes = list(scores.notes)
        if use != retrieval and card_note:
            notes.insert(0, card_note)
        out.append(
            SeparabilityGroup(
                pairing=pairing,
                condition=condition,
                n_conversations=scores.n_conversations,
                n_personas=scores.n_personas,
                silhouette=finite(scores.silhouette),
                davies_bouldin=finite(scores.davies_bouldin),
                intra_mean=scores.intra_mean,
                intra_sd=scores.intra_sd,
                retrieval=scores.retrieval,
                n_queries=scores.n_queries,
                acc_at_k=scores.acc_at_k,
                random_at_k=scores.random_at_k,
                note="; ".join(notes) or None,
            )
        )
        for c, rank, silhouette in zip(members, scores.ranks, scores.silhouette_samples, strict=True):
            per_dialogue[c.dialogue_id] = {
                f"persona_hit_at_1{suffix}": math.nan if rank is None else float(rank == 1),
                f"persona_silhouette{suffix}": math.nan if silhouette is None else silhouette,
            }
        if not suffix:
            pca_xy.update(_pca(members, x))
    return out, pca_xy, per_dialogue


def load_metrics(path: str | Path) -> Metrics:
    """Read a metrics.json written by :func:`evaluate` (a run dir or eval dir also works)."""
    path = Path(path)
    for candidate in (path, path / METRICS_FILE, path / EVAL_DIRNAME / METRICS_FILE):
        if candidate.is_file():
            return Metrics.model_validate_json(candidate.read_text(encoding="utf-8"))
    raise UserError(f"No metrics.json at {path}; run `spasm eval {path}` first.")


def load_per_dialogue(eval_dir: str | Path) -> pd.DataFrame:
    """Read per_dialogue.parquet from an eval directory."""
    return pd.read_parquet(Path(eval_dir) / PER_DIALOGUE_FILE)


def comparison_for(eval_dir: str | Path, metrics: Metrics, *, baseline: str | None = None) -> Comparison:
    """The paired comparison of an evaluated run, from its per_dialogue.parquet."""
    path = Path(eval_dir) / PER_DIALOGUE_FILE
    if not path.is_file():
        raise UserError(f"No {path}; run `spasm eval {metrics.run_dir}` first.")
    frame = load_per_dialogue(eval_dir)
    return compare_conditions(frame, metrics, baseline=baseline, run_dir=metrics.run_dir)


def _card_vectors(
    data: RunData,
    personas: Mapping[str, Persona],
    embed: Any,
    retrieval: Retrieval,
) -> tuple[dict[str, FloatArray] | None, str | None]:
    if retrieval != "card":
        return None, None
    cards: dict[str, str] = {}
    for pid, p in personas.items():
        if p.card.strip():
            cards[pid] = p.card
    used = {c.persona_id for c in data.conversations}
    if not used or not used <= set(cards):
        return None, (
            f"{len(used - set(cards))} persona(s) have no card, so retrieval "
            "used leave-one-out centroids instead"
        )
    ids = sorted(used)
    vecs = embed([cards[p] for p in ids], "embedding persona cards")
    return {p: vecs[i] for i, p in enumerate(ids)}, None


def _pca(members: list[Conversation], x: FloatArray) -> dict[str, tuple[float, float]]:
    from sklearn.decomposition import PCA

    if len(members) < 3:
        return {c.dialogue_id: (0.0, 0.0) for c in members}
    # Embeddings all equal have no variance: every point maps to (0, 0), and scikit-learn's
    # explained-variance ratio (never read here) divides by zero; no warning for that.
    with np.errstate(invalid="ignore", divide="ignore"):
        xy = PCA(n_components=2, random_state=0).fit_transform(x)
    return {c.dialogue_id: (float(xy[i, 0]), float(xy[i, 1])) for i, c in enumerate(members)}


#: A group dialogue's two-party echoing columns: missing, not "no echoing".
_NO_ECHO_VERDICT: dict[str, object] = {
    "echoing": None, "echo_who": None, "echo_score": math.nan, "echo_client_score": math.nan,
    "echo_responder_score": math.nan, "echo_method": None, "echo_evidence": None,
}


def _per_dialogue(
    convs: list[Conversation],
    means: Mapping[str, Mapping[str, float]],
    verdicts: Mapping[str, EchoVerdict],
    pca_xy: Mapping[str, tuple[float, float]],
    realism: pd.DataFrame | None = None,
    threshold: float = DEFAULT_THRESHOLD,
) -> pd.DataFrame:
    realism_rows: dict[str, dict[str, object]] = (
        {str(k): {str(c): v for c, v in r.items()} for k, r in realism.to_dict("index").items()}
        if realism is not None
        else {}
    )
    rows = []
    scenarios = any(c.scenario_id is not None for c in convs)
    trials = any(c.trial is not None for c in convs)
    rewards = any(c.reward is not None for c in convs)
    for c in convs:
        v = verdicts.get(c.dialogue_id)
        xy = pca_xy.get(c.dialogue_id, (math.nan, math.nan))
        row: dict[str, object] = {
            "dialogue_id": c.dialogue_id,
            "persona_id": c.persona_id,
            "conversation_index": c.conversation_index,
            "seed": c.seed,
            "pairing": c.pairing,
            "condition": c.condition,
            "harness_level": c.harness_level,
            "n_utterances": len(c.texts),
            "n_client_turns": c.sides.count("client"),
        }
        if scenarios:  # goal success, compared like the other per-dialogue metrics
            row["scenario_id"] = c.scenario_id
            row["goal_met"] = math.nan if c.goal_met is None else float(c.goal_met)
        if trials:  # a run with trials: which trial (pass^k groups them by the rest of the id)
            row["trial"] = c.trial
        if rewards:  # a run with rewards: the outcome pass^k reads
            row["reward"] = math.nan if c.reward is None else c.reward
        for dim in DRIFT_DIMENSIONS:
            row[drift_column(dim)] = means.get(c.dialogue_id, {}).get(dim, math.nan)
        row.update(
            {
                "echoing": bool(v.echoing) if v else False,
                "echo_who": v.who if v else "none",
                "echo_score": v.score if v else 0.0,
                "echo_client_score": v.client_score if v else 0.0,
                "echo_responder_score": v.responder_score if v else 0.0,
                "echo_method": v.method if v else "rule",
                "echo_evidence": " | ".join(v.evidence) if v else "",
                "pca_x": xy[0],
                "pca_y": xy[1],
                "echo_onset_turn": onset_turn(v, threshold) if v else None,
                "echo_turn_scores": turn_scores(v, len(c.texts)) if v else [],
            }
        )
        if v is None and c.is_group:  # no two-party verdict: its group_echo* columns say it
            row.update(_NO_ECHO_VERDICT)
        row.update(realism_rows.get(c.dialogue_id, {}))
        rows.append(row)
    frame = pd.DataFrame(rows)
    for column in ("seed", "echo_onset_turn", "trial"):
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    return frame

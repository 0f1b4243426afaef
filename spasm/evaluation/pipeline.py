"""``evaluate``: run every metric on a run directory and write metrics.json and the report."""

from __future__ import annotations

import datetime as dt
import functools
import math
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import anyio
import numpy as np
import pandas as pd
from tqdm import tqdm

from spasm.errors import UserError
from spasm.evaluation.drift import (
    DriftSeries,
    cheap_drift,
    condition_summaries,
    dialogue_means,
    drift_curves,
    paired_comparisons,
    probe_drift,
    references,
)
from spasm.evaluation.echoing import DEFAULT_THRESHOLD, EchoVerdict, judge_echoing, rule_echoing
from spasm.evaluation.embeddings import (
    CachedEmbedder,
    Embedder,
    FloatArray,
    create_embedder,
    l2_normalise,
)
from spasm.evaluation.files import atomic_write_parquet, atomic_write_text
from spasm.evaluation.llm import ChatFn
from spasm.evaluation.loader import Conversation, RunData, load_run
from spasm.evaluation.metrics import (
    Counts,
    DriftMetrics,
    EchoExample,
    EchoingMetrics,
    EchoRate,
    Metrics,
    SeparabilityGroup,
)
from spasm.evaluation.report import write_report
from spasm.evaluation.separability import Retrieval, separability_scores
from spasm.evaluation.stats import wilson_interval

__all__ = ["EVAL_DIRNAME", "evaluate", "load_metrics", "load_per_dialogue"]

EVAL_DIRNAME = "eval"
METRICS_FILE = "metrics.json"
PER_DIALOGUE_FILE = "per_dialogue.parquet"
REPORT_FILE = "report.html"
CACHE_DIRNAME = "embeddings-cache"


def _bar(total: int | None, desc: str, enabled: bool) -> tqdm[Any]:
    return tqdm(total=total, desc=desc, unit="it", disable=not enabled, leave=False, dynamic_ncols=True)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def evaluate(
    run_dir: str | Path,
    *,
    embedder: str | Embedder = "local",
    embedder_options: Mapping[str, Any] | None = None,
    mode: Literal["cheap", "probe"] = "cheap",
    chat: ChatFn | None = None,
    judge: bool = False,
    retrieval: Retrieval = "card",
    echo_threshold: float = DEFAULT_THRESHOLD,
    out_dir: str | Path | None = None,
    concurrency: int = 8,
    progress: bool | None = None,
    write: bool = True,
) -> Metrics:
    """Compute drift, echoing and persona separability for a run directory.

    Args:
        run_dir: a directory with personas/dialogues/turns Parquet tables.
        embedder: a registered embedder name (``"local"``, ``"openai"``, ...) or an object.
        embedder_options: keyword options for :func:`create_embedder` (e.g. ``model``,
            ``base_url``, ``api_key_env`` for ``"openai"``).
        mode: ``"cheap"`` (utterances as stances) or ``"probe"`` (an LLM states them).
        chat: the LLM for probe mode and the judge (``async (messages, temperature) -> str``).
        judge: decide echoing with the LLM judge (falls back to the rule per conversation).
        retrieval: Acc@K against persona ``"card"`` embeddings or leave-one-out ``"centroid"``.
        echo_threshold: side score at which the rule flags echoing.
        out_dir: where to write metrics.json, per_dialogue.parquet and report.html
            (default ``RUN_DIR/eval``). The embedding cache always lives in ``RUN_DIR/eval``.
        concurrency: LLM calls in flight (probe and judge).
        progress: show progress bars (default: when stderr is a terminal).
        write: write the files (``False``: only return the metrics).

    Runs its own event loop for the LLM stages; from async code call it in a worker
    thread (``await anyio.to_thread.run_sync(functools.partial(evaluate, ...))``).

    Raises:
        UserError: bad arguments, or a run directory without the needed tables.
    """
    if mode not in ("cheap", "probe"):
        raise UserError(f"Unknown drift mode {mode!r}; use 'cheap' or 'probe'.")
    if retrieval not in ("card", "centroid"):
        raise UserError(f"Unknown retrieval {retrieval!r}; use 'card' or 'centroid'.")
    if (mode == "probe" or judge) and chat is None:
        raise UserError(
            "Probe mode and the echoing judge need an LLM: pass chat=... (from the CLI: "
            "--llm-model and --llm-base-url), or use --mode cheap without --judge."
        )
    show = sys.stderr.isatty() if progress is None else progress
    timings: dict[str, float] = {}
    t_start = time.perf_counter()

    run_dir = Path(run_dir)
    data = load_run(run_dir)
    convs = data.conversations
    timings["load"] = time.perf_counter() - t_start

    inner = (
        create_embedder(embedder, **dict(embedder_options or {})) if isinstance(embedder, str) else embedder
    )
    cached = CachedEmbedder(inner, run_dir / EVAL_DIRNAME / CACHE_DIRNAME, chunk_size=1024)

    def embed(texts: list[str], desc: str = "embedding") -> FloatArray:
        with _bar(cached.count_missing(texts), desc, show) as bar:
            cached.progress = bar.update
            try:
                return cached.embed(texts)
            finally:
                cached.progress = None

    # 1. Every utterance once (drift, echoing and separability all reuse these vectors).
    t0 = time.perf_counter()
    all_texts = [t for c in convs for t in c.texts]
    matrix = embed(all_texts, "embedding utterances") if all_texts else np.zeros((0, 1), np.float32)
    utt: dict[str, FloatArray] = {}
    client_vecs: dict[str, FloatArray] = {}
    row = 0
    for c in convs:
        utt[c.dialogue_id] = matrix[row : row + len(c.texts)]
        row += len(c.texts)
        mask = np.array([s == "client" for s in c.speakers], dtype=bool)
        client_vecs[c.dialogue_id] = utt[c.dialogue_id][mask]
    timings["embed_utterances"] = time.perf_counter() - t0

    # 2. Drift.
    t0 = time.perf_counter()
    personas = data.persona_rows()
    probe_calls = probe_fallbacks = 0
    if mode == "cheap":
        series: DriftSeries = cheap_drift(convs, client_vecs, personas, embed)
    else:
        assert chat is not None
        n_client = sum(len(v) for v in client_vecs.values())
        with _bar(n_client, "probing stances", show) as bar:
            series, probe_calls, probe_fallbacks = anyio.run(
                functools.partial(
                    probe_drift,
                    convs,
                    client_vecs,
                    embed,
                    chat,
                    concurrency=concurrency,
                    on_done=bar.update,
                )
            )
    means = dialogue_means(series)
    dims = ["utterance", "concerns", "emotion", "motivation"]
    drift_notes: list[str] = []
    conditions = {c.condition for c in convs}
    comparisons = paired_comparisons(means, convs)
    if not {"ecp", "concat"} <= conditions:
        drift_notes.append(
            "ECP vs CONCAT needs both conditions in the run; found: "
            + (", ".join(sorted(conditions)) or "none")
            + "."
        )
        comparisons = []
    elif all(c.n_pairs == 0 for c in comparisons):
        drift_notes.append(
            "No ECP dialogue has a CONCAT twin with the same persona, conversation index, "
            "pairing and harness level, so ECP vs CONCAT cannot be paired."
        )
        comparisons = []
    missing_fields = (
        [
            d
            for d in ("concerns", "emotion", "motivation")
            if all(not np.isfinite(s[d]).any() for s in series.values())
        ]
        if series
        else []
    )
    if missing_fields and mode == "cheap":
        drift_notes.append(
            "No persona field for: "
            + ", ".join(missing_fields)
            + " (the personas table lacks it), so those curves are empty."
        )
    drift = DriftMetrics(
        mode=mode,
        dimensions=dims,
        references=references(mode),
        curves=drift_curves(series, convs),
        by_condition=condition_summaries(means, convs),
        comparisons=comparisons,
        probe_calls=probe_calls,
        probe_fallbacks=probe_fallbacks,
        notes=drift_notes,
    )
    timings["drift"] = time.perf_counter() - t0

    # 3. Echoing.
    t0 = time.perf_counter()
    rule = {
        c.dialogue_id: rule_echoing(c, utt[c.dialogue_id], threshold=echo_threshold)
        for c in tqdm(convs, desc="echoing signals", disable=not show, leave=False)
    }
    verdicts: dict[str, EchoVerdict] = rule
    judge_calls = judge_fallbacks = 0
    kappa_rule_judge: float | None = None
    if judge:
        assert chat is not None
        with _bar(len(convs), "judging echoing", show) as bar:
            verdicts, judge_calls, judge_fallbacks = anyio.run(
                functools.partial(
                    judge_echoing,
                    convs,
                    rule,
                    chat,
                    concurrency=concurrency,
                    on_done=bar.update,
                )
            )
        kappa_rule_judge = _kappa(
            [rule[c.dialogue_id].echoing for c in convs],
            [verdicts[c.dialogue_id].echoing for c in convs],
        )
    kappa_human, human_note = _human_agreement(run_dir, verdicts)
    echoing = EchoingMetrics(
        method="judge" if judge else "rule",
        threshold=echo_threshold,
        rates=_echo_rates(convs, verdicts),
        overall=_echo_rate("all", "all", convs, verdicts),
        examples=_echo_examples(convs, verdicts),
        judge_calls=judge_calls,
        judge_fallbacks=judge_fallbacks,
        kappa_rule_vs_judge=kappa_rule_judge,
        kappa_human=kappa_human,
        human_note=human_note,
    )
    timings["echoing"] = time.perf_counter() - t0

    # 4. Separability per pairing × condition.
    t0 = time.perf_counter()
    conv_vec = {did: l2_normalise(v.mean(axis=0))[0] for did, v in client_vecs.items() if len(v)}
    card_vecs, card_note = _card_vectors(data, personas, embed, retrieval)
    groups: dict[tuple[str, str], list[Conversation]] = defaultdict(list)
    for c in convs:
        if c.dialogue_id in conv_vec:
            groups[(c.pairing, c.condition)].append(c)
    separability: list[SeparabilityGroup] = []
    pca_xy: dict[str, tuple[float, float]] = {}
    for (pairing, condition), members in sorted(groups.items(), key=_group_key):
        x = np.stack([conv_vec[c.dialogue_id] for c in members])
        labels = [c.persona_id for c in members]
        use = retrieval if card_vecs is not None or retrieval == "centroid" else "centroid"
        scores = separability_scores(x, labels, retrieval=use, cards=card_vecs)
        notes = list(scores.notes)
        if use != retrieval and card_note:
            notes.insert(0, card_note)
        separability.append(
            SeparabilityGroup(
                pairing=pairing,
                condition=condition,
                n_conversations=scores.n_conversations,
                n_personas=scores.n_personas,
                silhouette=_finite(scores.silhouette),
                davies_bouldin=_finite(scores.davies_bouldin),
                intra_mean=scores.intra_mean,
                intra_sd=scores.intra_sd,
                retrieval=scores.retrieval,
                n_queries=scores.n_queries,
                acc_at_k=scores.acc_at_k,
                random_at_k=scores.random_at_k,
                note="; ".join(notes) or None,
            )
        )
        pca_xy.update(_pca(members, x))
    timings["separability"] = time.perf_counter() - t0

    counts = Counts(
        personas=int(data.personas["persona_id"].nunique()),
        dialogues_total=data.n_dialogues_total,
        dialogues_ok=len(convs),
        utterances=len(all_texts),
        client_turns=sum(len(v) for v in client_vecs.values()),
        texts_embedded=cached.computed,
        texts_cached=cached.hits,
    )
    metrics = Metrics(
        run_dir=str(run_dir),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        embedder=inner.name,
        mode=mode,
        judge=judge,
        counts=counts,
        drift=drift,
        echoing=echoing,
        separability=separability,
        timings={},
    )
    per_dialogue = _per_dialogue(convs, means, verdicts, pca_xy)
    timings["total"] = time.perf_counter() - t_start
    metrics.timings = {k: round(v, 3) for k, v in timings.items()}
    if write:
        t0 = time.perf_counter()
        out = Path(out_dir) if out_dir is not None else run_dir / EVAL_DIRNAME
        atomic_write_text(out / METRICS_FILE, metrics.model_dump_json(indent=2))
        atomic_write_parquet(per_dialogue, out / PER_DIALOGUE_FILE)
        write_report(metrics, per_dialogue, out / REPORT_FILE)
        metrics.timings["report"] = round(time.perf_counter() - t0, 3)
        atomic_write_text(out / METRICS_FILE, metrics.model_dump_json(indent=2))
    return metrics


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


# --------------------------------------------------------------------------- helpers


def _group_key(item: tuple[tuple[str, str], object]) -> tuple[str, int, str]:
    """Pairing, then ECP before CONCAT before anything else."""
    (pairing, condition), _ = item
    return (pairing, {"ecp": 0, "concat": 1}.get(condition, 2), condition)


def _card_vectors(
    data: RunData,
    personas: Mapping[str, Mapping[str, object]],
    embed: Any,
    retrieval: Retrieval,
) -> tuple[dict[str, FloatArray] | None, str | None]:
    if retrieval != "card":
        return None, None
    cards: dict[str, str] = {}
    for pid, p in personas.items():
        card = p.get("card")
        if isinstance(card, str) and card.strip():
            cards[pid] = card
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
    xy = PCA(n_components=2, random_state=0).fit_transform(x)
    return {c.dialogue_id: (float(xy[i, 0]), float(xy[i, 1])) for i, c in enumerate(members)}


def _echo_rate(
    pairing: str, condition: str, convs: list[Conversation], verdicts: Mapping[str, EchoVerdict]
) -> EchoRate:
    vs = [verdicts[c.dialogue_id] for c in convs if c.dialogue_id in verdicts]
    k = sum(v.echoing for v in vs)
    low, high = wilson_interval(k, len(vs))
    return EchoRate(
        pairing=pairing,
        condition=condition,
        n=len(vs),
        n_echoing=k,
        rate=k / len(vs) if vs else None,
        ci_low=_finite(low),
        ci_high=_finite(high),
        by_client=sum(v.echoing and v.who == "client" for v in vs),
        by_responder=sum(v.echoing and v.who == "responder" for v in vs),
    )


def _echo_rates(convs: list[Conversation], verdicts: Mapping[str, EchoVerdict]) -> list[EchoRate]:
    groups: dict[tuple[str, str], list[Conversation]] = defaultdict(list)
    for c in convs:
        groups[(c.pairing, c.condition)].append(c)
    return [
        _echo_rate(p, cond, members, verdicts)
        for (p, cond), members in sorted(groups.items(), key=_group_key)
    ]


def _echo_examples(
    convs: list[Conversation], verdicts: Mapping[str, EchoVerdict], limit: int = 10
) -> list[EchoExample]:
    info = {c.dialogue_id: c for c in convs}
    flagged = sorted((v for v in verdicts.values() if v.echoing), key=lambda v: -v.score)[:limit]
    return [
        EchoExample(
            dialogue_id=v.dialogue_id,
            pairing=info[v.dialogue_id].pairing,
            condition=info[v.dialogue_id].condition,
            who=v.who,
            score=v.score,
            evidence=v.evidence,
            method=v.method,
        )
        for v in flagged
    ]


def _kappa(a: list[bool], b: list[bool]) -> float | None:
    from sklearn.metrics import cohen_kappa_score

    if len(a) < 2 or len(set(a) | set(b)) < 2:
        return None
    value = float(cohen_kappa_score(a, b))
    return value if math.isfinite(value) else None


def _human_agreement(run_dir: Path, verdicts: Mapping[str, EchoVerdict]) -> tuple[float | None, str | None]:
    """Cohen's κ between the majority human echoing label per dialogue and ours.

    Reads ``annotations.parquet`` (columns ``dialogue_id`` and ``echoing``; one row per
    annotator and dialogue) when the run has one; otherwise reports nothing.
    """
    path = run_dir / "annotations.parquet"
    if not path.exists():
        return None, None
    try:
        ann = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several unrelated types
        return None, f"annotations.parquet could not be read ({exc})"
    if not {"dialogue_id", "echoing"} <= set(ann.columns):
        return None, "annotations.parquet has no dialogue_id/echoing columns"
    ann = ann.dropna(subset=["echoing"])
    majority = ann.groupby(ann["dialogue_id"].astype(str))["echoing"].mean() >= 0.5
    both = [d for d in majority.index if d in verdicts]
    if len(both) < 2:
        return None, f"only {len(both)} annotated dialogue(s) were evaluated"
    kappa = _kappa([bool(majority[d]) for d in both], [verdicts[d].echoing for d in both])
    return kappa, f"{len(both)} annotated dialogues (majority label per dialogue)"


def _per_dialogue(
    convs: list[Conversation],
    means: Mapping[str, Mapping[str, float]],
    verdicts: Mapping[str, EchoVerdict],
    pca_xy: Mapping[str, tuple[float, float]],
) -> pd.DataFrame:
    rows = []
    for c in convs:
        v = verdicts.get(c.dialogue_id)
        xy = pca_xy.get(c.dialogue_id, (math.nan, math.nan))
        row: dict[str, object] = {
            "dialogue_id": c.dialogue_id,
            "persona_id": c.persona_id,
            "conversation_index": c.conversation_index,
            "pairing": c.pairing,
            "condition": c.condition,
            "harness_level": c.harness_level,
            "n_utterances": len(c.texts),
            "n_client_turns": c.speakers.count("client"),
        }
        for dim in ("utterance", "concerns", "emotion", "motivation"):
            row[f"drift_{dim}"] = means.get(c.dialogue_id, {}).get(dim, math.nan)
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
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)

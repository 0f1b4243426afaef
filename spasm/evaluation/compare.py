"""``spasm compare``: every metric per condition, paired by persona and seed.

:func:`compare_conditions` reads the per-dialogue metrics (``per_dialogue.parquet``) and,
for every pair of conditions (the baseline — ECP when the run has it — against each other
condition first, then each remaining pair in order: ``ecp − concat``, ``ecp − quoted``,
``concat − quoted``), pairs dialogues on (pairing, persona_id, conversation_index, seed,
harness_level, scenario_id in a run with scenarios, and persona_set — the client seats'
personas — in a group run) — several dialogues of one condition
under one key are averaged first — and reports per metric: Δ = mean(first − second) with its
95% t-interval, the paired Cohen's d_z with an approximate 95% interval,
the paired t-test and Wilcoxon p-values, and the t-test p-value Holm-corrected across the
metrics of that contrast (and pairing). :func:`comparison_text` prints it with the older
ECP-vs-CONCAT drift and per-pairing tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from spasm.dataset.files import atomic_write_text
from spasm.errors import UserError
from spasm.evaluation.drift import DRIFT_DIMENSIONS, drift_column
from spasm.evaluation.metrics import GoalMetrics, GroupMetrics, Metrics, PairedComparison
from spasm.evaluation.owncontent import OWN_SUFFIX, own_column
from spasm.evaluation.realism import REALISM_METRICS
from spasm.evaluation.stats import cohen_dz_interval, finite, holm, mean_ci, paired_test
from spasm.registry import ordered_conditions

__all__ = [
    "COMPARED_METRICS",
    "PAIR_KEY",
    "Comparison",
    "ConditionMean",
    "Contrast",
    "GroupLevel",
    "compare_conditions",
    "comparison_text",
    "group_text",
    "load_comparison",
    "mark_copying",
    "write_comparison",
]

COMPARISON_SCHEMA_VERSION = 1
ALPHA = 0.05

#: ``drift_<dimension>`` per dialogue, in the order of :data:`~spasm.evaluation.drift.DRIFT_DIMENSIONS`.
_DRIFT_COLUMNS = tuple(drift_column(d) for d in DRIFT_DIMENSIONS)

#: The per-dialogue columns compared, in reporting order (those a run has); the one list of
#: them (the report's forest plot and ``spasm compare`` read it through :func:`compare_conditions`).
COMPARED_METRICS: tuple[str, ...] = (
    *_DRIFT_COLUMNS,
    # The same on the Client's own content (copied spans removed; owncontent.py).
    *(own_column(c) for c in _DRIFT_COLUMNS),
    # Persona separability per dialogue (its persona retrieved first; its silhouette value),
    # raw and on own content: their means are the group's Acc@1 and silhouette.
    *(name for m in ("persona_hit_at_1", "persona_silhouette") for name in (m, own_column(m))),
    "echoing",
    "echo_score",
    *REALISM_METRICS,
    "consistency_prompt_to_line",
    own_column("consistency_prompt_to_line"),
    "consistency_line_to_line",
    "qa_consistency",
    "language_compliance_client",
    "language_compliance_responder",
    "goal_met",
    # Runs with tools: the Client repeats a payload it could not see (spasm.evaluation.leaks);
    # --simulator-errors: a critical error of the simulated user (spasm.evaluation.simulator).
    "payload_leak",
    "sim_critical",
    # Group runs (spasm.evaluation.group): role confusion per dialogue.
    "group_impersonation",
    "group_impersonation_share",
    "group_echo",
    "group_echo_max",
    "group_silence",
    "group_silence_rate",
    "group_loop",
    "group_loop_longest",
    *(f"group_{c}" for c in _DRIFT_COLUMNS),
    *(f"group_{own_column(c)}" for c in _DRIFT_COLUMNS),
)
#: Dialogues of two conditions are the same "experiment" when these agree.
#: ``scenario_id`` and ``persona_set`` (a group dialogue's client personas) count only in runs
#: that have them.
PAIR_KEY: tuple[str, ...] = (
    "pairing", "persona_id", "conversation_index", "seed", "harness_level", "scenario_id",
    "persona_set",
)
_OPTIONAL_KEYS = ("scenario_id", "persona_set")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConditionMean(_Model):
    """One metric's mean over one condition's dialogues (all pairings), with a t 95% CI."""

    metric: str
    condition: str
    n: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None


class Contrast(_Model):
    """One metric, one condition (``baseline``: the pair's first) vs another, paired;
    Δ = baseline − condition."""

    metric: str
    baseline: str
    condition: str
    pairing: str = Field(description="a pairing, or 'all'")
    n_pairs: int
    mean_baseline: float | None
    mean_condition: float | None
    delta: float | None
    delta_ci_low: float | None
    delta_ci_high: float | None
    effect_size: float | None = Field(description="paired Cohen's d_z = mean(diff) / sd(diff)")
    effect_ci_low: float | None
    effect_ci_high: float | None
    p_ttest: float | None
    p_wilcoxon: float | None
    p_holm: float | None = Field(description="t-test p, Holm-corrected over this contrast's metrics")
    significant: bool = Field(description="p_holm < alpha")
    note: str | None = None
    explained_by_copying: bool = Field(
        False,
        description="significant on the raw text, not on the Client's own content (its _own metric)",
    )


class GroupLevel(_Model):
    """Metrics defined per pairing × condition only (no per-dialogue value to pair)."""

    pairing: str
    condition: str
    n: int
    echo_rate: float | None
    silhouette: float | None
    davies_bouldin: float | None
    intra_mean: float | None
    acc_at_1: float | None
    random_at_1: float | None
    silhouette_own: float | None = None
    davies_bouldin_own: float | None = None
    acc_at_1_own: float | None = None


class Comparison(_Model):
    """``compare.json``: every metric per condition, and each condition against the baseline."""

    schema_version: int = COMPARISON_SCHEMA_VERSION
    run_dir: str
    baseline: str | None
    conditions: list[str]
    pair_key: list[str]
    metrics: list[str]
    alpha: float = ALPHA
    correction: str = "holm"
    means: list[ConditionMean]
    contrasts: list[Contrast]
    groups: list[GroupLevel]
    notes: list[str] = Field(default_factory=list)
    copying: str | None = Field(
        None, description="which significant differences vanish once copying is removed (own content)"
    )


def _groups(metrics: Metrics | None) -> list[GroupLevel]:
    if metrics is None:
        return []
    sep = {(g.pairing, g.condition): g for g in metrics.separability}
    own = {(g.pairing, g.condition): g for g in metrics.separability_own}
    out = []
    for r in metrics.echoing.rates:
        g = sep.get((r.pairing, r.condition))
        o = own.get((r.pairing, r.condition))
        out.append(
            GroupLevel(
                pairing=r.pairing,
                condition=r.condition,
                n=r.n,
                echo_rate=r.rate,
                silhouette=g.silhouette if g else None,
                davies_bouldin=g.davies_bouldin if g else None,
                intra_mean=g.intra_mean if g else None,
                acc_at_1=g.acc_at_k[0] if g and g.acc_at_k else None,
                random_at_1=g.random_at_k[0] if g and g.random_at_k else None,
                silhouette_own=o.silhouette if o else None,
                davies_bouldin_own=o.davies_bouldin if o else None,
                acc_at_1_own=o.acc_at_k[0] if o and o.acc_at_k else None,
            )
        )
    return out


def mark_copying(contrasts: Sequence[Contrast]) -> str | None:
    """Mark every raw difference that is significant while its own-content counterpart (the
    ``_own`` metric of the same contrast and pairing) is not — ``explained_by_copying`` — and
    say in one sentence which differences vanish once copying is removed (``None`` when no
    metric has an own-content counterpart)."""
    by_key = {(c.metric, c.baseline, c.condition, c.pairing): c for c in contrasts}
    vanish: list[str] = []
    remain: list[str] = []
    appear: list[str] = []
    counterparts = 0
    for c in contrasts:
        if c.metric.endswith(OWN_SUFFIX):
            continue
        o = by_key.get((own_column(c.metric), c.baseline, c.condition, c.pairing))
        if o is None:
            continue
        counterparts += 1
        label = f"{c.metric} ({c.baseline} − {c.condition}" + (
            ")" if c.pairing == "all" else f", {c.pairing})")
        if c.significant and not o.significant:
            c.explained_by_copying = True
            vanish.append(label)
        elif c.significant:
            remain.append(label)
        elif o.significant:
            appear.append(label)
    if not counterparts:
        return None
    if not (vanish or remain):
        sentence = ("No raw drift, separability or consistency difference is significant, so copying "
                    "explains none")
    elif vanish:
        sentence = ("Once copying is removed (own content), these differences vanish: " + ", ".join(vanish)
                    + ("; these remain: " + ", ".join(remain) if remain else ""))
    else:
        sentence = "Every significant raw difference remains once copying is removed: " + ", ".join(remain)
    if appear:
        sentence += "; significant on own content only: " + ", ".join(appear)
    return sentence + "."


def compare_conditions(
    per_dialogue: pd.DataFrame,
    metrics: Metrics | None = None,
    *,
    baseline: str | None = None,
    run_dir: str | Path = "",
) -> Comparison:
    """Every metric of ``per_dialogue`` per condition, and paired for every pair of conditions
    (``baseline`` against each other one first, then the remaining pairs in order).

    Args:
        per_dialogue: the evaluation's per-dialogue frame (``per_dialogue.parquet``).
        metrics: the run's :class:`Metrics`, for the group-level rows (echoing rate,
            separability); optional.
        baseline: the condition every other one is compared with (default: ``ecp`` if
            present, else the first condition in order).

    Raises:
        UserError: ``baseline`` is not a condition of the run.
    """
    frame = per_dialogue.copy()
    conditions = ordered_conditions(frame["condition"].astype(str).tolist()) if "condition" in frame else []
    if baseline is not None and baseline not in conditions:
        raise UserError(
            f"--baseline {baseline!r} is not a condition of this run; it has: "
            + (", ".join(conditions) or "none")
            + "."
        )
    base = baseline or (conditions[0] if conditions else None)
    names = [m for m in COMPARED_METRICS if m in frame]
    for m in names:
        frame[m] = pd.to_numeric(frame[m].astype(float), errors="coerce")
    names = [m for m in names if np.isfinite(frame[m].to_numpy(dtype=float)).any()]
    key = [k for k in PAIR_KEY if k in frame and (k not in _OPTIONAL_KEYS or frame[k].notna().any())]
    notes: list[str] = []
    if "seed" not in frame:
        notes.append("per_dialogue.parquet has no seed column (an older evaluation): paired without it.")

    means = []
    for m in names:
        for cond in conditions:
            values = frame.loc[frame["condition"] == cond, m].to_numpy(dtype=float)
            mean, low, high, n = mean_ci(values.tolist())
            means.append(
                ConditionMean(
                    metric=m,
                    condition=cond,
                    n=n,
                    mean=finite(mean),
                    ci_low=finite(low),
                    ci_high=finite(high),
                )
            )

    contrasts: list[Contrast] = []
    others = [c for c in conditions if c != base]
    ordered = [base, *others] if base is not None else []
    pairs = [(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1 :]]
    if base is None or not others:
        notes.append(
            "Only one condition (" + (base or "none") + ") in the run: nothing to pair. Generate the "
            "same personas and seeds under another projection to compare."
        )
    pairings = sorted(frame["pairing"].astype(str).unique()) if "pairing" in frame else []
    scopes = ["all", *pairings] if len(pairings) > 1 else ["all"]
    cells = frame.groupby([*key, "condition"], dropna=False)[names].mean() if names and key else None
    for first, cond in pairs:
        for scope in scopes:
            family: list[Contrast] = []
            for m in names:
                a, b = _paired(cells, key, first, cond, m, scope)
                res = paired_test(a, b)
                n_pairs = int(res["n_pairs"] or 0)
                dz = finite(res["cohen_d"])
                low, high = cohen_dz_interval(dz, n_pairs) if dz is not None else (math.nan, math.nan)
                family.append(
                    Contrast(
                        metric=m,
                        baseline=first,
                        condition=cond,
                        pairing=scope,
                        n_pairs=n_pairs,
                        mean_baseline=finite(res["mean_a"]),
                        mean_condition=finite(res["mean_b"]),
                        delta=finite(res["delta"]),
                        delta_ci_low=finite(res["delta_ci_low"]),
                        delta_ci_high=finite(res["delta_ci_high"]),
                        effect_size=dz,
                        effect_ci_low=finite(low),
                        effect_ci_high=finite(high),
                        p_ttest=finite(res["p_ttest"]),
                        p_wilcoxon=finite(res["p_wilcoxon"]),
                        p_holm=None,
                        significant=False,
                        note=None if res["note"] is None else str(res["note"]),
                    )
                )
            for c, p in zip(family, holm([c.p_ttest for c in family]), strict=True):
                c.p_holm = p
                c.significant = p is not None and p < ALPHA
            if all(c.n_pairs == 0 for c in family) and scope == "all":
                notes.append(
                    f"No {cond} dialogue has a {first} twin with the same {', '.join(key)}: "
                    f"{first} vs {cond} cannot be paired."
                )
            contrasts.extend(family)
    copying = mark_copying(contrasts)
    return Comparison(
        run_dir=str(run_dir),
        baseline=base,
        conditions=conditions,
        pair_key=key,
        metrics=names,
        means=means,
        contrasts=contrasts,
        groups=_groups(metrics),
        notes=notes,
        copying=copying,
    )


def _paired(
    cells: pd.DataFrame | None, key: list[str], base: str, cond: str, metric: str, scope: str
) -> tuple[list[float], list[float]]:
    """The baseline's and the condition's cell means of ``metric`` on their common keys."""
    if cells is None:
        return [], []
    table = cells[metric].unstack("condition")
    if base not in table or cond not in table:
        return [], []
    if scope != "all":
        table = table[table.index.get_level_values("pairing") == scope]
    both = table[[base, cond]].dropna()
    return both[base].tolist(), both[cond].tolist()


def write_comparison(comparison: Comparison, path: str | Path) -> Path:
    """Write ``compare.json`` atomically."""
    path = Path(path)
    atomic_write_text(path, comparison.model_dump_json(indent=2))
    return path


def load_comparison(path: str | Path) -> Comparison:
    """Read a ``compare.json``."""
    return Comparison.model_validate_json(Path(path).read_text(encoding="utf-8"))


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    if value != 0 and abs(value) < 10**-digits:
        return f"{value:.1e}"
    return f"{value:.{digits}f}"


def _ci(rate: float | None, low: float | None, high: float | None) -> str:
    if rate is None:
        return "—"
    return f"{rate:.0%} [{_num(low, 2)}, {_num(high, 2)}]"


def comparison_text(metrics: Metrics, comparison: Comparison | None = None) -> str:
    """Two tables: ΔDrift (ECP − CONCAT) per dimension and pairing; then per pairing ×
    condition the echoing rate and persona separability; with ``comparison``, a third:
    every metric against the baseline, paired, with Holm-corrected p-values."""
    parts = [
        f"Run: {metrics.run_dir}   embedder: {metrics.embedder}   drift mode: "
        f"{metrics.drift.mode}   echoing: {metrics.echoing.method}"
    ]
    rows = [_drift_row(p) for p in metrics.drift.comparisons]
    parts.append(f"\n{metrics.drift.comparison_title()} — per-dialogue mean drift (client turns "
                 "t >= 1), paired")
    if rows:
        parts.append(pd.DataFrame(rows).to_string(index=False))
    else:
        parts.append("  (no pairs) " + " ".join(metrics.drift.notes))
    own = metrics.drift.own
    if own is not None and own.comparisons:
        parts.append("\nThe same on the Client's own content (copied spans of >= "
                     f"{metrics.own_content.ngram if metrics.own_content else 4} words removed)")
        parts.append(pd.DataFrame([_drift_row(p) for p in own.comparisons]).to_string(index=False))

    sep = {(g.pairing, g.condition): g for g in metrics.separability}
    sep_own = {(g.pairing, g.condition): g for g in metrics.separability_own}
    rows = []
    for r in metrics.echoing.rates:
        g = sep.get((r.pairing, r.condition))
        o = sep_own.get((r.pairing, r.condition))
        own_cells = {} if not sep_own else {
            "silhouette own": _num(o.silhouette if o else None, 2),
            "DBI own": _num(o.davies_bouldin if o else None, 2),
            "Acc@1 own": _num(o.acc_at_k[0] if o else None, 2),
        }
        rows.append(
            {
                "pairing": r.pairing,
                "condition": r.condition,
                "n": r.n,
                "echoing": _ci(r.rate, r.ci_low, r.ci_high),
                "silhouette": _num(g.silhouette if g else None, 2),
                "DBI": _num(g.davies_bouldin if g else None, 2),
                "intra": "—"
                if g is None or g.intra_mean is None
                else f"{g.intra_mean:.2f}±{(g.intra_sd or 0):.2f}",
                "Acc@1": _num(g.acc_at_k[0] if g else None, 2),
                "random@1": _num(g.random_at_k[0] if g else None, 2),
                **own_cells,
            }
        )
    parts.append("\nPer pairing × condition — echoing (Wilson 95% CI) and persona separability")
    parts.append(pd.DataFrame(rows).to_string(index=False) if rows else "  (no dialogues)")
    if metrics.goals is not None:
        parts.append(goal_text(metrics.goals))
    if metrics.group is not None:
        parts.append(group_text(metrics.group))
    if comparison is not None:
        parts.append(_contrast_text(comparison))
    return "\n".join(parts) + "\n"


def _drift_row(p: PairedComparison) -> dict[str, object]:
    return {
        "dimension": p.dimension,
        "pairing": p.pairing,
        "pairs": p.n_pairs,
        "ECP": _num(p.mean_ecp),
        "CONCAT": _num(p.mean_concat),
        "ΔDrift": _num(p.delta),
        "95% CI": f"[{_num(p.delta_ci_low)}, {_num(p.delta_ci_high)}]",
        "Cohen d": _num(p.cohen_d, 2),
        "p(t)": _num(p.p_ttest),
        "p(W)": _num(p.p_wilcoxon),
        "note": p.note or "",
    }


def goal_text(goals: GoalMetrics) -> str:
    """Goal success per condition and pairing (and per scenario), Wilson 95% intervals."""
    rows = [
        {
            "pairing": r.pairing,
            "condition": r.condition,
            "scenario": r.scenario_id,
            "n": r.n,
            "goal met": _ci(r.rate, r.ci_low, r.ci_high),
            "undecided": r.undecided,
        }
        for r in goals.rates
    ]
    head = f"\nGoal success ({goals.scenarios} scenarios; Wilson 95% CI; undecided: no verdict)"
    return head + "\n" + (pd.DataFrame(rows).to_string(index=False) if rows else "  (no dialogues)")


def group_text(group: GroupMetrics) -> str:
    """Role confusion of a group run per condition: the share of dialogues each detector flags
    (Wilson 95% CI) and the mean impersonation share, highest pair copy and longest loop (t CI)."""
    rates = {(r.metric, r.condition): r for r in group.rates}
    stats = {(s.metric, s.condition): s for s in group.stats}
    conditions = list(dict.fromkeys(r.condition for r in group.rates))
    rows = []
    for cond in conditions:
        row: dict[str, object] = {"condition": cond, "n": rates[("impersonation", cond)].n}
        for metric in ("impersonation", "echo", "silence", "loop"):
            r = rates[(metric, cond)]
            row[metric] = _ci(r.rate, r.ci_low, r.ci_high)
        for metric, label in (("impersonation_share", "imp. share"), ("echo_max", "max copy"),
                              ("loop_longest", "longest A-B")):
            st = stats.get((metric, cond))
            row[label] = ("—" if st is None
                          else f"{_num(st.mean, 2)} [{_num(st.ci_low, 2)}, {_num(st.ci_high, 2)}]")
        rows.append(row)
    head = (f"\nGroup role confusion ({group.dialogues} dialogues, up to {group.participants_max} "
            "participants; share of dialogues flagged, Wilson 95% CI; means with t 95% CI)")
    body = pd.DataFrame(rows).to_string(index=False) if rows else "  (no group dialogues)"
    return head + "\n" + body + "".join(f"\n  note: {n}" for n in group.notes)


def _contrast_text(comparison: Comparison) -> str:
    rows = [
        {
            "metric": c.metric,
            "contrast": f"{c.baseline} − {c.condition}",
            "pairs": c.n_pairs,
            "Δ": _num(c.delta),
            "95% CI": f"[{_num(c.delta_ci_low)}, {_num(c.delta_ci_high)}]",
            "d_z": _num(c.effect_size, 2),
            "p(t)": _num(c.p_ttest),
            "p(Holm)": _num(c.p_holm),
            "": "*" if c.significant else "",
            **({"copying": "explained by copying" if c.explained_by_copying else ""}
               if comparison.copying is not None else {}),
        }
        for c in comparison.contrasts
        if c.pairing == "all"
    ]
    head = (
        f"\nEvery metric, paired on {', '.join(comparison.pair_key)} "
        f"(Δ = baseline − condition; * = Holm-corrected p < {comparison.alpha:g} across metrics)"
    )
    if not rows:
        return head + "\n  (nothing to pair) " + " ".join(comparison.notes)
    tail = f"\n{comparison.copying}" if comparison.copying else ""
    return head + "\n" + pd.DataFrame(rows).to_string(index=False) + tail

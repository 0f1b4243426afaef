"""The self-contained HTML report: four figures (base64 PNG) and the summary tables.

Figures follow the SPASM paper: drift by client turn per condition (Fig. 2), a 2-D PCA
map of conversation embeddings coloured by persona (Fig. 3), persona-retrieval Acc@K per
pairing against the random baseline (Fig. 4) and echoing rates by pairing × condition
(Table 4, as a bar chart); then the echoing onset by utterance, the realism table and a forest
plot of every metric's paired effect. Everything is embedded, so the file can be mailed or archived.
:func:`report_figures` returns the figures as data (:class:`~spasm.evaluation.figures.ReportFigure`),
which the HTML embeds and ``spasm eval`` also writes to ``figures.json`` for the viewer.
A run with group dialogues gets a group section first, drawn by
:mod:`~spasm.evaluation.report_group`; the primitives both draw with are in
:mod:`~spasm.evaluation.report_parts`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from spasm.dataset.files import atomic_write_text
from spasm.evaluation.figures import ReportFigure
from spasm.evaluation.metrics import ConditionSummary, Metrics, PairedComparison, SeparabilityGroup
from spasm.evaluation.report_agents import outcomes_html
from spasm.evaluation.report_group import (
    GROUP_ONLY,
    GroupFrames,
    group_figures,
    group_html,
    group_only,
    has_group,
)
from spasm.evaluation.report_human import human_html
from spasm.evaluation.report_parts import _ci, _colour, _empty, _fmt, _or, _png, _table
from spasm.registry import condition_rank, ordered_conditions

if TYPE_CHECKING:
    from spasm.evaluation.compare import Comparison

__all__ = [
    "SECTIONS", "GroupFrames", "ReportContext", "Section", "render_report", "report_figures", "write_report",
]


def _group_label(pairing: str, condition: str) -> str:
    return f"{pairing} · {condition.upper()}"


def _own_curves_differ(metrics: Metrics) -> bool:
    """Whether the own-content drift curves differ from the raw ones anywhere (they are
    equal, and not drawn, when the run has no copying)."""
    own = metrics.drift.own
    if own is None:
        return False
    raw = {(p.dimension, p.condition, p.turn): p.mean for p in metrics.drift.curves}
    return any(raw.get((p.dimension, p.condition, p.turn)) != p.mean for p in own.curves)


def figure_drift(metrics: Metrics) -> Figure:
    """Mean drift per client turn, one panel per dimension, one line per condition; dashed, the
    same on the Client's own content when copying was removed anywhere."""
    dims = metrics.drift.dimensions
    points = metrics.drift.curves
    own_points = metrics.drift.own.curves if metrics.drift.own and _own_curves_differ(metrics) else []
    if not dims or not points:
        return _empty("No drift curve: no dialogue has a Client turn.")
    cols = 2 if len(dims) > 1 else 1
    rows = math.ceil(len(dims) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), squeeze=False)
    extra: list[str] = []
    for ax, dim in zip(axes.flat, dims, strict=False):
        conditions = ordered_conditions(p.condition for p in points if p.dimension == dim)
        for cond in conditions:
            pts = sorted(
                (p for p in points if p.dimension == dim and p.condition == cond),
                key=lambda p: p.turn,
            )
            pts = [p for p in pts if p.mean is not None]
            if not pts:
                continue
            x = [p.turn for p in pts]
            colour = _colour(cond, extra)
            ax.plot(x, [p.mean for p in pts], marker="o", ms=3, color=colour, label=f"{cond.upper()}")
            # Small samples give t-intervals past drift's range [0, 2]; draw them clipped.
            ax.fill_between(
                x,
                [max(0.0, _or(p.ci_low, p.mean)) for p in pts],
                [min(2.0, _or(p.ci_high, p.mean)) for p in pts],
                color=colour,
                alpha=0.18,
                linewidth=0,
            )
            own = sorted((p for p in own_points if p.dimension == dim and p.condition == cond
                          and p.mean is not None), key=lambda p: p.turn)
            if own:
                ax.plot([p.turn for p in own], [p.mean for p in own], linestyle="--", marker="x", ms=3,
                        color=colour, label=f"{cond.upper()} own content")
        ax.set_title(f"{dim}  ({metrics.drift.mode})")
        ax.set_xlabel("Client turn t")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("Drift = 1 − cos")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a dimension with no mean anywhere has no line
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(dims) :]:
        ax.set_axis_off()
    fig.suptitle("Drift by Client turn (mean ± 95% CI)")
    fig.tight_layout()
    return fig


def figure_map(metrics: Metrics, per_dialogue: pd.DataFrame) -> Figure:
    """PCA map of conversation embeddings, one panel per pairing × condition."""
    if per_dialogue.empty or "pca_x" not in per_dialogue.columns:
        return _empty("No conversation embeddings to map.")
    df = per_dialogue.dropna(subset=["pca_x", "pca_y"])
    groups = sorted(
        {(str(p), str(c)) for p, c in zip(df["pairing"], df["condition"], strict=True)},
        key=lambda g: (g[0], *condition_rank(g[1])),
    )
    if not groups:
        return _empty("No conversation embeddings to map.")
    cols = 2 if len(groups) in (2, 4) else min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.2 * rows), squeeze=False)
    cmap = plt.get_cmap("tab20")
    personas = sorted(df["persona_id"].unique())
    colour_of = {p: cmap(i % 20) for i, p in enumerate(personas)}
    for ax, (pairing, condition) in zip(axes.flat, groups, strict=False):
        g = df[(df["pairing"] == pairing) & (df["condition"] == condition)]
        ax.scatter(
            g["pca_x"],
            g["pca_y"],
            c=[colour_of[p] for p in g["persona_id"]],
            s=14 if len(g) > 300 else 30,
            alpha=0.8,
            linewidths=0,
        )
        ax.set_title(_group_label(str(pairing), str(condition)), fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
    for ax in list(axes.flat)[len(groups) :]:
        ax.set_axis_off()
    if len(personas) <= 12:
        handles = [Line2D([], [], marker="o", ls="", color=colour_of[p], label=str(p)) for p in personas]
        fig.legend(
            handles=handles,
            loc="lower center",
            ncol=min(6, len(personas)),
            fontsize=8,
            frameon=False,
            bbox_to_anchor=(0.5, -0.02),
        )
    repeat = "; colours repeat past 20" if len(personas) > 20 else ""
    fig.suptitle(
        f"Client side of each conversation, PCA (colour = persona, {len(personas)} personas{repeat})"
    )
    fig.tight_layout(rect=(0, 0.05 if len(personas) <= 12 else 0, 1, 1))
    return fig


def figure_acc(metrics: Metrics) -> Figure:
    """Acc@K curves per pairing × condition, each with its random baseline (dashed)."""
    groups = [g for g in metrics.separability if any(a is not None for a in g.acc_at_k)]
    if not groups:
        return _empty("No persona retrieval: see the separability notes.")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    cmap = plt.get_cmap("tab10")
    # One grey baseline when every group has the same number of candidates.
    same_baseline = all(g.random_at_k == groups[0].random_at_k for g in groups)
    for i, g in enumerate(groups):
        ks = list(range(1, len(g.acc_at_k) + 1))
        colour = cmap(i % 10)
        ax.plot(
            ks,
            [a if a is not None else math.nan for a in g.acc_at_k],
            marker="o",
            ms=4,
            color=colour,
            label=_group_label(g.pairing, g.condition),
        )
        if not same_baseline:
            ax.plot(
                ks,
                [r if r is not None else math.nan for r in g.random_at_k],
                ls="--",
                color=colour,
                alpha=0.6,
            )
    baseline_ks = list(range(1, len(groups[0].random_at_k) + 1))
    ax.plot(
        baseline_ks if same_baseline else [],
        [r if r is not None else math.nan for r in groups[0].random_at_k] if same_baseline else [],
        ls="--",
        color="grey",
        label="random baseline (K/N)",
    )
    ax.set_xlabel("K")
    ax.set_ylabel("Acc@K")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(range(1, len(groups[0].acc_at_k) + 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Persona retrieval from the Client side ({groups[0].retrieval} matching)")
    fig.tight_layout()
    return fig


def figure_echo(metrics: Metrics) -> Figure:
    """Echoing rate per pairing (groups) and condition (bars) with Wilson 95% CIs."""
    rates = [r for r in metrics.echoing.rates if r.rate is not None]
    if not rates:
        return _empty("No conversations to judge for echoing.")
    pairings = sorted({r.pairing for r in rates})
    conditions = ordered_conditions(r.condition for r in rates)
    width = 0.8 / len(conditions)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(pairings) + 2), 4))
    extra: list[str] = []
    for j, cond in enumerate(conditions):
        xs, ys, lo, hi = [], [], [], []
        for i, pairing in enumerate(pairings):
            r = next((r for r in rates if r.pairing == pairing and r.condition == cond), None)
            if r is None or r.rate is None:
                continue
            xs.append(i + (j - (len(conditions) - 1) / 2) * width)
            ys.append(r.rate)
            # max(0, ...): matplotlib rejects the -1e-17 that rounding can leave.
            lo.append(max(0.0, r.rate - (r.ci_low if r.ci_low is not None else r.rate)))
            hi.append(max(0.0, (r.ci_high if r.ci_high is not None else r.rate) - r.rate))
        ax.bar(
            xs,
            ys,
            width=width * 0.95,
            yerr=[lo, hi],
            capsize=3,
            color=_colour(cond, extra),
            label=cond.upper(),
        )
        for x, y, h in zip(xs, ys, hi, strict=True):
            # Above the error bar, so the label never sits on it.
            ax.text(x, y + h + 0.015, f"{y:.0%}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(pairings)))
    ax.set_xticklabels(pairings, rotation=20 if len(pairings) > 4 else 0)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("Echoing rate")
    ax.set_title(f"Echoing rate by pairing and condition ({metrics.echoing.method}, Wilson 95% CI)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def figure_onset(metrics: Metrics) -> Figure:
    """Share of each pairing × condition's dialogues that have started echoing by utterance t."""
    curves = [c for c in metrics.echoing.onset if c.share_by_turn]
    if not curves:
        return _empty("No echoing onset: no conversation was evaluated.")
    fig, ax = plt.subplots(figsize=(7, 4))
    extra: list[str] = []
    pairings = sorted({c.pairing for c in curves})
    styles = ["-", "--", ":", "-."]
    for c in curves:
        ax.step(
            range(len(c.share_by_turn)),
            c.share_by_turn,
            where="post",
            color=_colour(c.condition, extra),
            ls=styles[pairings.index(c.pairing) % len(styles)],
            label=f"{_group_label(c.pairing, c.condition)} ({c.n_echoing}/{c.n})",
        )
    ax.set_xlabel("utterance t (0 = the Client's opening)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share echoing by t")
    top = max(max(c.share_by_turn) for c in curves)
    ax.set_ylim(0, max(0.05, min(1.0, top * 1.15)))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Echoing onset ({metrics.echoing.method}): cumulative share of dialogues")
    fig.tight_layout()
    return fig


def figure_forest(comparison: Comparison | None) -> Figure:
    """Paired effect sizes (Cohen's d_z, 95% CI) of every metric, one marker per contrast."""
    rows = [] if comparison is None else [c for c in comparison.contrasts if c.pairing == "all"]
    rows = [c for c in rows if c.effect_size is not None]
    if comparison is None or not rows:
        return _empty("No paired effect to plot: it needs two conditions on the same personas and seeds.")
    metrics = [m for m in comparison.metrics if any(c.metric == m for c in rows)]
    # One marker series per contrast (a pair of conditions), in the comparison's order.
    pairs = list(dict.fromkeys((r.baseline, r.condition) for r in rows))
    fig, ax = plt.subplots(figsize=(7.5, 0.38 * len(metrics) * max(1, len(pairs)) + 1.4))
    extra: list[str] = []
    step = 0.7 / max(1, len(pairs))
    for j, (first, cond) in enumerate(pairs):
        colour = _colour(cond if first == comparison.baseline else f"{first}-{cond}", extra)
        for c in (r for r in rows if (r.baseline, r.condition) == (first, cond)):
            y = len(metrics) - 1 - metrics.index(c.metric) + (j - (len(pairs) - 1) / 2) * step
            dz = c.effect_size or 0.0
            low, high = _or(c.effect_ci_low, dz), _or(c.effect_ci_high, dz)
            ax.errorbar(
                dz, y, xerr=[[max(0.0, dz - low)], [max(0.0, high - dz)]], fmt="o", color=colour,
                mfc=colour if c.significant else "white", capsize=2, ms=5,
            )
        ax.plot([], [], "o", color=colour, label=f"{first} − {cond}")
    ax.axvline(0, color="grey", lw=1)
    ax.set_yticks(range(len(metrics)))
    ax.set_yticklabels(list(reversed(metrics)), fontsize=8)
    ax.set_xlabel("paired Cohen's d_z (baseline − condition), 95% CI; filled: Holm p < 0.05")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title("Every metric, paired by persona and seed (forest plot)")
    fig.tight_layout()
    return fig


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2rem auto;
max-width:1100px;color:#222;line-height:1.45;padding:0 1rem}
h1{margin-bottom:.2rem}h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
.meta{color:#666;font-size:.9rem}
table{border-collapse:collapse;margin:.6rem 0 1rem;font-size:.88rem}
th,td{border:1px solid #ddd;padding:.25rem .55rem;text-align:right}
th{background:#f4f6f8}td:first-child,th:first-child{text-align:left}
td.l{text-align:left}
figure{margin:1rem 0}img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.88rem}
ul.notes{color:#555;font-size:.88rem}
blockquote{margin:.2rem 0 .2rem 1rem;color:#333;font-size:.88rem}
"""


_DRIFT_CAPTION = "Drift by Client turn per condition (cf. SPASM Fig. 2). Shaded: 95% CI."
_DRIFT_OWN_CAPTION = " Dashed: the same on the Client's own content (copied spans removed)."
_MAP_CAPTION = "Conversation embeddings (Client side) in 2-D, coloured by persona (cf. SPASM Fig. 3)."
_ACC_CAPTION = "Persona retrieval Acc@K per pairing × condition; dashed: random baseline (cf. SPASM Fig. 4)."
_ECHO_CAPTION = "Share of conversations in which one side mirrored the other (cf. SPASM Table 4)."
_ONSET_CAPTION = (
    "Echoing onset: share of the dialogues of each group that have started echoing by utterance t "
    "(first utterance of the echoing side at or over the threshold of the rule)."
)
_FOREST_CAPTION = (
    "Forest plot: paired effect size (Cohen d_z) of every per-dialogue metric, baseline − condition, "
    "with 95% intervals; filled markers are significant after Holm correction across the metrics."
)


def report_figures(
    metrics: Metrics,
    per_dialogue: pd.DataFrame,
    comparison: Comparison | None = None,
    group: GroupFrames | None = None,
) -> list[ReportFigure]:
    """The report's figures, in the order it shows them: for a run with group dialogues first
    group_rates, group_echo_pairs and group_drift (``group``: the rows behind the last two);
    then drift, map, acc, echo, onset, forest."""
    figures = group_figures(metrics, group)
    only = group_only(metrics)  # the two-party figures say where the group dialogues went

    def blank() -> Figure:
        return _empty(GROUP_ONLY)

    return [
        *figures,
        ReportFigure.from_png("drift", _DRIFT_CAPTION + (_DRIFT_OWN_CAPTION if _own_curves_differ(metrics)
                                                          else ""),
                              _png(blank() if only else figure_drift(metrics))),
        ReportFigure.from_png("map", _MAP_CAPTION,
                              _png(blank() if only else figure_map(metrics, per_dialogue))),
        ReportFigure.from_png("acc", _ACC_CAPTION, _png(blank() if only else figure_acc(metrics))),
        ReportFigure.from_png("echo", _ECHO_CAPTION, _png(blank() if only else figure_echo(metrics))),
        ReportFigure.from_png("onset", _ONSET_CAPTION, _png(blank() if only else figure_onset(metrics))),
        ReportFigure.from_png("forest", _FOREST_CAPTION, _png(figure_forest(comparison))),
    ]


def _realism_html(metrics: Metrics) -> str:
    r = metrics.realism
    if r is None:
        return "<p>Not computed (an older metrics.json).</p>"
    ref = (
        f"z-scores against <b>{html.escape(r.reference.run_dir)}</b> ({r.reference.dialogues} dialogues)."
        if r.reference is not None
        else "No reference corpus: values only (<code>spasm eval RUN --reference OTHER</code> adds z-scores)."
    )
    table = _table(
        ["metric", "pairing", "condition", "dialogues", "mean", "95% CI", "mean z", "z 95% CI"],
        [
            [s.metric, s.pairing, s.condition, s.n, s.mean, _ci(s.ci_low, s.ci_high), s.mean_z,
             _ci(s.z_ci_low, s.z_ci_high)]
            for s in r.stats
        ],
    )
    defs = "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in r.definitions.items()
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in r.notes)
    return f"<p class='meta'>{ref}</p>{table}<ul class='notes'>{defs}{notes}</ul>"


def _language_html(metrics: Metrics) -> str:
    g = metrics.language
    if g is None:
        return ""
    table = _table(
        ["side", "pairing", "condition", "dialogues", "compliance", "95% CI", "off-language utterances"],
        [
            [s.side, s.pairing, s.condition, s.n, s.mean, _ci(s.ci_low, s.ci_high), s.off_language]
            for s in g.stats
        ],
    )
    flagged = "".join(
        f"<li><b>{html.escape(f.dialogue_id)}</b> utterance {f.turn_index} ({html.escape(f.speaker)}): "
        f"{html.escape(f.detected)} ({f.probability:.2f}), expected {html.escape(f.expected)}"
        f"<blockquote>{html.escape(f.text)}</blockquote></li>"
        for f in g.flagged
    )
    return (
        "<h2>Language compliance</h2>"
        f"<p class='meta'>{html.escape(g.identifier)} on every utterance of at least {g.min_letters} "
        f"letters; flagged when another language has probability ≥ {g.min_confidence:g}. "
        f"Expected: {html.escape(', '.join(g.expected) or '—')}; {g.n_flagged} flagged.</p>"
        f"{table}" + (f"<ul>{flagged}</ul>" if flagged else "")
    )


def _judges_html(metrics: Metrics) -> str:
    """Persona consistency and the judge ensemble, when they ran."""
    parts = []
    c = metrics.consistency
    if c is not None:
        parts.append("<h2>Persona consistency (LLM-judged)</h2>")
        parts.append(
            f"<p class='meta'>Share of consistent Client lines; judges: {html.escape(', '.join(c.judges))}; "
            f"{c.calls} calls, {c.fallbacks} fallbacks.</p>"
        )
        parts.append(
            _table(
                ["measure", "pairing", "condition", "dialogues", "mean", "95% CI"],
                [[s.measure, s.pairing, s.condition, s.n, s.mean, _ci(s.ci_low, s.ci_high)] for s in c.stats],
            )
        )
        parts.append("<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in c.notes) + "</ul>")
    e = metrics.judges
    if e is not None:
        parts.append("<h2>Judges</h2>")
        parts.extend(f"<p class='meta'><b>Warning:</b> {html.escape(w)}</p>" for w in e.warnings)
        parts.append(
            _table(
                ["judge", "model", "family", "metric", "dialogues", "value", "fallbacks"],
                [[r.judge, r.model, r.family, r.metric, r.n, r.value, r.fallbacks] for r in e.results],
            )
        )
        parts.append(
            _table(
                ["metric", "judges", "items", "Fleiss' κ", "agreement", "disagreements"],
                [
                    [a.metric, a.n_judges, a.n_items, a.kappa, a.agreement, a.n_disagreements]
                    for a in e.agreement
                ],
            )
        )
        listed = e.disagreements[:20]
        if listed:
            parts.append(
                "<h3>Disagreements (first 20; all in metrics.json, up to 50 per metric)</h3><ul>"
                + "".join(
                    f"<li>{html.escape(d.metric)} · {html.escape(d.item)}: "
                    + html.escape(", ".join(f"{j} {v}" for j, v in d.labels.items()))
                    + "</li>"
                    for d in listed
                )
                + "</ul>"
            )
    return "".join(parts)


def _onset_html(metrics: Metrics) -> str:
    return _table(
        ["pairing", "condition", "conversations", "echoing", "median onset", "first onset"],
        [
            [c.pairing, c.condition, c.n, c.n_echoing, c.median_onset, c.first_onset]
            for c in metrics.echoing.onset
        ],
    )


def _contrasts_html(comparison: Comparison | None) -> str:
    if comparison is None:
        return "<p>No comparison.</p>"
    own = comparison.copying is not None  # the run has own-content metrics beside the raw ones
    rows = [
        [
            c.metric, f"{c.baseline} − {c.condition}", c.pairing, c.n_pairs, c.delta,
            _ci(c.delta_ci_low, c.delta_ci_high), c.effect_size, _ci(c.effect_ci_low, c.effect_ci_high),
            c.p_ttest, c.p_holm, "yes" if c.significant else "", c.note or "",
            *(["explained by copying" if c.explained_by_copying else ""] if own else []),
        ]
        for c in comparison.contrasts
    ]
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in comparison.notes)
    table = (
        _table(
            ["metric", "contrast", "pairing", "pairs", "Δ", "95% CI", "d_z", "d_z 95% CI", "p (t)",
             "p (Holm)", "Holm p < 0.05", "note", *(["own content"] if own else [])],
            rows,
        )
        if rows
        else ""
    )
    if own:
        table = f"<p><b>{html.escape(comparison.copying or '')}</b></p>" + table
    return (
        f"<p class='meta'>Paired on {html.escape(', '.join(comparison.pair_key))}; "
        f"Holm correction across the metrics of each contrast and pairing. Also in compare.json.</p>"
        f"{table}<ul class='notes'>{notes}</ul>"
    )


def _drift_table(comparisons: Sequence[PairedComparison]) -> str:
    rows = [
        [
            p.dimension,
            p.pairing,
            p.n_pairs,
            p.mean_ecp,
            p.mean_concat,
            p.delta,
            _ci(p.delta_ci_low, p.delta_ci_high),
            p.cohen_d,
            p.p_ttest,
            p.p_wilcoxon,
            p.note or "",
        ]
        for p in comparisons
    ]
    if not rows:
        return "<p>No ECP/CONCAT pairs in this run.</p>"
    return _table(
        ["dimension", "pairing", "pairs", "ECP", "CONCAT", "ΔDrift", "95% CI", "Cohen's d", "p (t)",
         "p (Wilcoxon)", "note"],
        rows,
    )


def _by_condition_table(summaries: Sequence[ConditionSummary]) -> str:
    return _table(
        ["dimension", "condition", "dialogues", "mean drift (t ≥ 1)", "95% CI"],
        [[s.dimension, s.condition, s.n_dialogues, s.mean, _ci(s.ci_low, s.ci_high)] for s in summaries],
    )


def _separability_table(groups: Sequence[SeparabilityGroup]) -> str:
    sep = _table(
        [
            "pairing",
            "condition",
            "conversations",
            "personas",
            "silhouette",
            "DBI",
            "intra (mean ± sd)",
            "Acc@1",
            "Acc@5",
            "Acc@10",
            "random@1",
        ],
        [
            [
                g.pairing,
                g.condition,
                g.n_conversations,
                g.n_personas,
                g.silhouette,
                g.davies_bouldin,
                "—" if g.intra_mean is None else f"{g.intra_mean:.3f} ± {g.intra_sd or 0:.3f}",
                g.acc_at_k[0],
                g.acc_at_k[4] if len(g.acc_at_k) > 4 else None,
                g.acc_at_k[-1],
                g.random_at_k[0],
            ]
            for g in groups
        ],
    )
    # Notes go under the table: as a column they squeeze every other one.
    sep_notes = [f"{g.pairing} · {g.condition.upper()}: {g.note}" for g in groups if g.note]
    if sep_notes:
        sep += "<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in sep_notes) + "</ul>"
    return sep


def _own_html(m: Metrics, comparison: Comparison | None) -> str:
    """Drift on the Client's own content: the rule, how much it removed, the same tables as the
    raw drift, and the sentence saying which differences vanish once copying is removed."""
    oc, own = m.own_content, m.drift.own
    if oc is None or own is None:
        return ""
    counts = _table(
        ["condition", "dialogues", "Client utterances", "with copying", "left out",
         "copied share of Client words", "95% CI"],
        [[s.condition, s.dialogues, s.utterances, s.with_copying, s.left_out, s.copied_share,
          _ci(s.copied_share_ci_low, s.copied_share_ci_high)] for s in oc.stats],
    )
    sentence = (f"<p><b>{html.escape(comparison.copying)}</b></p>"
                if comparison is not None and comparison.copying else "")
    notes = [*own.notes, *oc.notes]
    notes_html = ("<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"
                  if notes else "")
    return (
        "<h3>On the Client's own content (copied spans removed)</h3>"
        f"<p class='meta'>{html.escape(oc.definition)}. Per-utterance values: per_turn.parquet.</p>"
        f"{counts}{sentence}<h4>ECP vs CONCAT on own content</h4>{_drift_table(own.comparisons)}"
        f"<h4>By condition, on own content</h4>{_by_condition_table(own.by_condition)}{notes_html}"
    )


@dataclass(frozen=True)
class ReportContext:
    """What every report section reads: the metrics, the per-dialogue rows, the paired
    comparison, a group run's rows and the drawn figures (embedded by :meth:`fig`)."""

    metrics: Metrics
    per_dialogue: pd.DataFrame
    comparison: Comparison | None
    group: GroupFrames | None
    figures: Mapping[str, ReportFigure]

    def fig(self, key: str) -> str:
        """The figure ``key`` of :func:`report_figures` as an embedded ``<figure>``."""
        figure = self.figures[key]
        caption = html.escape(figure.caption)
        return (
            f'<figure><img alt="{caption}" src="{figure.data_uri()}">'
            f"<figcaption>{caption}</figcaption></figure>"
        )

    @property
    def pointer(self) -> str:
        """Under a two-party heading: group dialogues are left out of drift, separability and
        echoing (their group forms are in the group section)."""
        if not has_group(self.metrics):
            return ""
        return ("<p class='meta'>Two-party dialogues only: the group dialogues are measured in "
                "“Group dialogues: role confusion” above.</p>")


#: A report section: its HTML from the :class:`ReportContext`, starting with a newline (or
#: ``""`` when it has nothing to show).
Section = Callable[[ReportContext], str]


def _summary_section(ctx: ReportContext) -> str:
    m = ctx.metrics
    c = m.counts
    summary = _table(
        ["", "value"],
        [
            ["personas", c.personas],
            ["dialogues (all statuses)", c.dialogues_total],
            ["dialogues evaluated (status ok)", c.dialogues_ok],
            ["utterances", c.utterances],
            ["Client turns", c.client_turns],
            ["texts embedded (new)", c.texts_embedded],
            ["embedding cache hits", c.texts_cached],
            ["embedder", m.embedder],
            ["drift mode", m.drift.mode],
            ["echoing decided by", m.echoing.method],
        ],
    )
    return f"\n<h2>Summary</h2>{summary}"


def _group_section(ctx: ReportContext) -> str:
    return group_html(ctx.metrics, ctx.group, ctx.fig)


def _drift_section(ctx: ReportContext) -> str:
    m = ctx.metrics
    refs = "".join(
        f"<li><b>{html.escape(d)}</b>: {html.escape(r)}</li>" for d, r in m.drift.references.items()
    )
    notes = [*m.drift.notes]
    if m.drift.mode == "probe":
        notes.append(
            f"Probe calls: {m.drift.probe_calls}, fallbacks to the utterance: {m.drift.probe_fallbacks}."
        )
    notes_html = (
        "<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>" if notes else ""
    )
    pair_title = html.escape(m.drift.comparison_title())
    drift_table = _drift_table(m.drift.comparisons)
    return f"""
<h2>Persona drift</h2>{ctx.pointer}
{ctx.fig("drift")}
<ul class="notes">{refs}</ul>
<h3>{pair_title} (per-dialogue mean drift over Client turns t ≥ 1, paired)</h3>{drift_table}
<h3>By condition</h3>{_by_condition_table(m.drift.by_condition)}
{notes_html}
{_own_html(m, ctx.comparison)}"""


def _separability_section(ctx: ReportContext) -> str:
    m = ctx.metrics
    own_sep = (
        "<h3>On the Client's own content</h3>" + _separability_table(m.separability_own)
        if m.separability_own
        else ""
    )
    return f"""
<h2>Persona separability</h2>{ctx.pointer}
{ctx.fig("map")}
{ctx.fig("acc")}
{_separability_table(m.separability)}
{own_sep}"""


def _echoing_section(ctx: ReportContext) -> str:
    m = ctx.metrics
    echo = _table(
        [
            "pairing",
            "condition",
            "conversations",
            "echoing",
            "rate",
            "Wilson 95% CI",
            "by Client",
            "by Responder",
        ],
        [
            [
                r.pairing,
                r.condition,
                r.n,
                r.n_echoing,
                r.rate,
                _ci(r.ci_low, r.ci_high),
                r.by_client,
                r.by_responder,
            ]
            for r in [*m.echoing.rates, m.echoing.overall]
        ],
    )
    examples = (
        "".join(
            f"<li><b>{html.escape(e.dialogue_id)}</b> ({html.escape(e.pairing)}, "
            f"{html.escape(e.condition.upper())}) — {html.escape(e.who)} echoes, score "
            f"{e.score:.2f}"
            + "".join(f"<blockquote>{html.escape(q)}</blockquote>" for q in e.evidence)
            + "</li>"
            for e in m.echoing.examples
        )
        or "<li>No conversation was flagged.</li>"
    )
    agreement = []
    if m.echoing.judge_calls:
        agreement.append(
            f"Judge calls: {m.echoing.judge_calls}, fallbacks to the rule: "
            f"{m.echoing.judge_fallbacks}; Cohen's κ rule vs judge: "
            f"{_fmt(m.echoing.kappa_rule_vs_judge)}."
        )
    if m.echoing.kappa_human is not None or m.echoing.human_note:
        agreement.append(
            f"Agreement with human labels (Cohen's κ): {_fmt(m.echoing.kappa_human)}"
            + (f" — {m.echoing.human_note}" if m.echoing.human_note else "")
            + "."
        )
    return f"""
<h2>Echoing</h2>{ctx.pointer}
{ctx.fig("echo")}
{echo}
{"".join(f"<p class='meta'>{html.escape(a)}</p>" for a in agreement)}
<h3>Flagged conversations (up to 10)</h3><ul>{examples}</ul>
<h3>Echoing onset</h3>
{ctx.fig("onset")}
{_onset_html(m)}"""


def _realism_section(ctx: ReportContext) -> str:
    return f"\n<h2>Realism: lexical diversity and diagnostics</h2>\n{_realism_html(ctx.metrics)}"


def _human_section(ctx: ReportContext) -> str:
    return "\n" + human_html(ctx.metrics)


def _language_section(ctx: ReportContext) -> str:
    return "\n" + _language_html(ctx.metrics)


def _judges_section(ctx: ReportContext) -> str:
    return "\n" + _judges_html(ctx.metrics)


def _outcomes_section(ctx: ReportContext) -> str:
    return "\n" + outcomes_html(ctx.metrics)


def _paired_section(ctx: ReportContext) -> str:
    return f"""
<h2>Every metric, paired</h2>
{ctx.fig("forest")}
{_contrasts_html(ctx.comparison)}"""


#: The report's sections, in page order (after its title line). A metric adds its section
#: here (docs/architecture.md, "Adding an extension").
SECTIONS: list[Section] = [
    _summary_section,
    _group_section,
    _drift_section,
    _separability_section,
    _echoing_section,
    _realism_section,
    _human_section,
    _language_section,
    _judges_section,
    _outcomes_section,
    _paired_section,
]


def render_report(
    metrics: Metrics,
    per_dialogue: pd.DataFrame,
    figures: Sequence[ReportFigure] | None = None,
    comparison: Comparison | None = None,
    group: GroupFrames | None = None,
) -> str:
    """The report as one HTML string (no external resources): its title line, then each of
    :data:`SECTIONS`. ``figures``: those of :func:`report_figures`, when the caller has drawn
    them already; ``comparison``: the paired comparison of every metric
    (:func:`spasm.evaluation.compare.compare_conditions`); ``group``: a group run's
    per-participant and per-pair rows (its group section's tables)."""
    m = metrics
    if figures is None:
        figures = report_figures(m, per_dialogue, comparison, group)
    ctx = ReportContext(m, per_dialogue, comparison, group, {f.name: f for f in figures})
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in m.timings.items())
    head = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>spasm evaluation — {html.escape(Path(m.run_dir).name)}</title>
<style>{_CSS}</style></head><body>
<h1>spasm evaluation</h1>
<p class="meta">{html.escape(m.run_dir)} · {html.escape(m.created_at)} · {html.escape(timings)}</p>"""
    return head + "".join(section(ctx) for section in SECTIONS) + "\n</body></html>\n"


def write_report(
    metrics: Metrics,
    per_dialogue: pd.DataFrame,
    path: str | Path,
    figures: Sequence[ReportFigure] | None = None,
    comparison: Comparison | None = None,
    group: GroupFrames | None = None,
) -> Path:
    """Render the report and write it atomically to ``path`` (``figures``, ``comparison`` and
    ``group`` as in :func:`render_report`)."""
    path = Path(path)
    atomic_write_text(path, render_report(metrics, per_dialogue, figures, comparison, group))
    return path

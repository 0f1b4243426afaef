"""The eval report's group section (runs with group dialogues): its figures and its HTML.

Three figures, first in the report and in ``figures.json``: per-condition role-confusion
rates (Wilson 95% CIs) and per-dialogue shares (t 95% CIs), who echoes whom (a heatmap of
``per_pair.parquet``) and drift per client seat (``per_participant.parquet``); then the
section's tables. :mod:`spasm.evaluation.report` assembles the page around it; the primitives
both draw with are in :mod:`spasm.evaluation.report_parts`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from spasm.evaluation.drift import DRIFT_DIMENSIONS, drift_column
from spasm.evaluation.figures import ReportFigure
from spasm.evaluation.metrics import GroupRate, Metrics
from spasm.evaluation.report_parts import _ci, _colour, _empty, _fmt, _or, _png, _table
from spasm.evaluation.stats import mean_ci, wilson_interval
from spasm.registry import ordered_conditions

__all__ = [
    "GROUP_ONLY",
    "GroupFrames",
    "PairCell",
    "SeatDrift",
    "figure_group_drift",
    "figure_group_echo",
    "figure_group_rates",
    "group_figures",
    "group_html",
    "group_only",
    "group_pair_table",
    "group_seat_drift",
    "has_group",
]


@dataclass(frozen=True)
class GroupFrames:
    """A group run's rows behind the report's group section: ``per_participant.parquet`` (one
    row per dialogue and participant) and ``per_pair.parquet`` (one per dialogue and ordered
    pair), as :func:`spasm.evaluation.group.group_stage` returns them."""

    per_participant: pd.DataFrame
    per_pair: pd.DataFrame


_GROUP_RATES = ("impersonation", "echo", "silence", "loop")
_GROUP_RATE_LABELS = {"impersonation": "impersonation", "echo": "echo (any pair)",
                      "silence": "silence", "loop": "loop"}
_GROUP_SHARES = {"impersonation_share": "impersonated\nutterances", "echo_max": "highest pair\ncopy share",
                 "silence_rate": "unanswered\naddresses"}


def has_group(metrics: Metrics) -> bool:
    """The run has group dialogues: the report gets the group section and its figures."""
    return metrics.group is not None and metrics.group.dialogues > 0


def group_only(metrics: Metrics) -> bool:
    """Every evaluated dialogue is a group dialogue: the two-party figures have nothing to show."""
    return has_group(metrics) and metrics.group is not None and (
        metrics.group.dialogues >= metrics.counts.dialogues_ok)


# What each two-party figure shows instead when every dialogue is a group dialogue.
GROUP_ONLY = "No two-party dialogue: the group dialogues are measured in the group section."


def _bars(ax: Axes, groups: Sequence[str], conditions: Sequence[str],
          value: Callable[[str, str], tuple[float | None, float | None, float | None]],
          percent: bool, top: float) -> None:
    """Grouped bars (one group per entry of ``groups``, one bar per condition) with their
    intervals; ``value(group, condition)`` gives (value, low, high)."""
    width = 0.8 / max(1, len(conditions))
    extra: list[str] = []
    for j, cond in enumerate(conditions):
        xs, ys, lo, hi = [], [], [], []
        for i, g in enumerate(groups):
            y, low, high = value(g, cond)
            if y is None or not math.isfinite(y):
                continue
            xs.append(i + (j - (len(conditions) - 1) / 2) * width)
            ys.append(y)
            # Clipped to the axis (small samples give t-intervals past the range); max(0, ...):
            # matplotlib rejects the -1e-17 that rounding can leave.
            lo.append(max(0.0, y - max(0.0, _or(low, y))))
            hi.append(max(0.0, min(top, _or(high, y)) - y))
        ax.bar(xs, ys, width=width * 0.95, yerr=[lo, hi], capsize=3, color=_colour(cond, extra),
               label=cond.upper())
        for x, y, h in zip(xs, ys, hi, strict=True):
            ax.text(x, y + h + 0.01 * top, f"{y:.0%}" if percent else f"{y:.2f}", ha="center",
                    va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_ylim(0, top * 1.1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def figure_group_rates(metrics: Metrics) -> Figure:
    """Role confusion per condition: the share of group dialogues each detector flags (Wilson
    95% CI), and the mean per-dialogue shares (t 95% CI)."""
    g = metrics.group
    rates = [r for r in (g.rates if g else []) if r.condition != "all" and r.rate is not None]
    if g is None or not rates:
        return _empty("No group dialogue to measure.")
    conditions = ordered_conditions(r.condition for r in rates)
    by_rate: dict[tuple[str, str], GroupRate] = {(r.metric, r.condition): r for r in rates}
    by_stat = {(s.metric, s.condition): s for s in g.stats}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [4, 3]})

    def rate(metric: str, cond: str) -> tuple[float | None, float | None, float | None]:
        r = by_rate.get((metric, cond))
        return (None, None, None) if r is None else (r.rate, r.ci_low, r.ci_high)

    def share(metric: str, cond: str) -> tuple[float | None, float | None, float | None]:
        s = by_stat.get((metric, cond))
        return (None, None, None) if s is None else (s.mean, s.ci_low, s.ci_high)

    _bars(left, _GROUP_RATES, conditions, rate, percent=True, top=1.0)
    left.set_xticklabels([_GROUP_RATE_LABELS[m] for m in _GROUP_RATES])
    left.set_ylabel("share of group dialogues flagged")
    left.set_title("Dialogues flagged (Wilson 95% CI)", fontsize=10)
    _bars(right, list(_GROUP_SHARES), conditions, share, percent=False, top=1.0)
    right.set_xticklabels(list(_GROUP_SHARES.values()), fontsize=8)
    right.set_ylabel("mean per dialogue")
    right.set_title("Per-dialogue shares (t 95% CI)", fontsize=10)
    fig.suptitle(f"Role confusion in {g.dialogues} group dialogues by condition "
                 f"(echo: a pair copies ≥ {g.echo_threshold:g}; loop: ≥ {g.loop_min} alternating)")
    fig.tight_layout()
    return fig


def _seat_order(frames: GroupFrames) -> list[str]:
    """Participant ids in seat order (their usual position), then by id."""
    seats = frames.per_participant
    if seats.empty:
        return sorted(set(frames.per_pair["participant_id"]) | set(frames.per_pair["source_id"]))
    position = pd.to_numeric(seats["position"], errors="coerce").astype(float)
    order = position.groupby(seats["participant_id"].astype(str)).median()
    return sorted(order.index, key=lambda p: (order[p] if math.isfinite(order[p]) else math.inf, p))


@dataclass(frozen=True)
class PairCell:
    """One ordered pair under one condition: how much ``participant_id`` copies ``source_id``."""

    condition: str
    participant_id: str
    source_id: str
    dialogues: int
    mean: float  # mean pair score over the dialogues both sit in
    ci_low: float  # Student-t 95%
    ci_high: float
    relays: int  # dialogues where the pair reaches the relay threshold
    relay_ci_low: float  # Wilson 95% of relays / dialogues
    relay_ci_high: float


def group_pair_table(frames: GroupFrames) -> list[PairCell]:
    """Pairwise echo by condition, in condition then seat order: the mean pair score over the
    dialogues both sit in (t 95% CI) and in how many of them the pair relays (Wilson 95% CI)."""
    pairs = frames.per_pair
    cells = []
    for (cond, who, source), g in pairs.groupby(["condition", "participant_id", "source_id"], sort=False):
        mean, low, high, n = mean_ci([float(v) for v in g["score"]])
        k = int(g["relays"].astype(bool).sum())
        r_low, r_high = wilson_interval(k, n)
        cells.append(PairCell(str(cond), str(who), str(source), n, mean, low, high, k, r_low, r_high))
    seat = {p: i for i, p in enumerate(_seat_order(frames))}
    rank = {c: i for i, c in enumerate(ordered_conditions(c.condition for c in cells))}
    return sorted(cells, key=lambda c: (rank[c.condition], seat.get(c.participant_id, len(seat)),
                                        seat.get(c.source_id, len(seat)), c.participant_id, c.source_id))


def figure_group_echo(frames: GroupFrames | None) -> Figure:
    """Who echoes whom: per condition, a participant × participant heatmap of the mean pair
    score (rows copy from columns), with how many dialogues the pair relays in."""
    if frames is None:
        return _empty("No pairwise echo: the per-pair rows (per_pair.parquet) were not given.")
    table = group_pair_table(frames)
    if not table:
        return _empty("No pairwise echo: no group dialogue has two participants.")
    ids = _seat_order(frames)
    conditions = ordered_conditions(c.condition for c in table)
    cols = min(3, len(conditions))
    rows = math.ceil(len(conditions) / cols)
    side = max(3.2, 0.75 * len(ids) + 1.6)
    fig, axes = plt.subplots(rows, cols, figsize=(side * cols + 1.2, side * rows), squeeze=False)
    cmap = plt.get_cmap("Reds").with_extremes(bad="#eeeeee")
    image = None
    for k, (ax, cond) in enumerate(zip(axes.flat, conditions, strict=False)):
        cells = {(c.participant_id, c.source_id): c for c in table if c.condition == cond}
        grid = np.full((len(ids), len(ids)), np.nan)
        for i, who in enumerate(ids):
            for j, source in enumerate(ids):
                c = cells.get((who, source))
                if c is None or not math.isfinite(c.mean):
                    continue
                grid[i, j] = c.mean
                ax.text(j, i, f"{c.mean:.2f}\n{c.relays}/{c.dialogues}", ha="center", va="center",
                        fontsize=7, color="white" if c.mean > 0.6 else "black")
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(ids)))
        ax.set_xticklabels(ids, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(ids)))
        ax.set_yticklabels(ids, fontsize=8)
        ax.set_xlabel("source (said it first or just before)")
        if k % cols == 0:
            ax.set_ylabel("copier")
        ax.set_title(cond.upper(), fontsize=10)
    for ax in list(axes.flat)[len(conditions):]:
        ax.set_axis_off()
    if image is not None:
        fig.colorbar(image, ax=list(axes.flat), shrink=0.8, label="mean pair copy share")
    fig.suptitle("Who echoes whom: mean copy share per ordered pair (cell: mean, and relaying "
                 "dialogues / dialogues)")
    return fig


@dataclass(frozen=True)
class SeatDrift:
    """One client seat's drift on one dimension under one condition."""

    dimension: str
    condition: str
    participant_id: str
    dialogues: int
    mean: float  # mean over dialogues of the seat's drift (its utterances t >= 1)
    ci_low: float  # Student-t 95%
    ci_high: float


def group_seat_drift(frames: GroupFrames) -> list[SeatDrift]:
    """Drift per client seat by dimension and condition, with a t 95% CI; seats and dimensions
    without a value are left out."""
    seats = frames.per_participant
    if seats.empty:
        return []
    seats = seats[seats["role"].astype(str) == "client"]
    out = []
    for dim in DRIFT_DIMENSIONS:
        column = drift_column(dim)
        if column not in seats:
            continue
        for (cond, pid), g in seats.groupby(["condition", "participant_id"], sort=False):
            mean, low, high, n = mean_ci([float(v) for v in g[column]])
            if n:
                out.append(SeatDrift(dim, str(cond), str(pid), n, mean, low, high))
    return out


def figure_group_drift(frames: GroupFrames | None) -> Figure:
    """Persona drift per client seat: one panel per dimension, one bar per seat and condition."""
    if frames is None:
        return _empty("No drift per client seat: the per-participant rows (per_participant.parquet) "
                      "were not given.")
    table = group_seat_drift(frames)
    if not table:
        return _empty("No drift per client seat: no client seat spoke twice.")
    dims = [d for d in DRIFT_DIMENSIONS if any(c.dimension == d for c in table)]
    seats = [p for p in _seat_order(frames) if any(c.participant_id == p for c in table)]
    conditions = ordered_conditions(c.condition for c in table)
    cols = 2 if len(dims) > 1 else 1
    rows = math.ceil(len(dims) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(6.0, 1.1 * len(seats) + 3) * cols, 3.4 * rows),
                             squeeze=False)
    highs = [c.ci_high for c in table if math.isfinite(c.ci_high)]
    top = max(0.05, min(2.0, max(highs, default=0.0) * 1.05))
    for ax, dim in zip(axes.flat, dims, strict=False):
        cells = {(c.participant_id, c.condition): c for c in table if c.dimension == dim}

        def value(seat: str, cond: str, cells: dict[tuple[str, str], SeatDrift] = cells
                  ) -> tuple[float | None, float | None, float | None]:
            c = cells.get((seat, cond))
            return (None, None, None) if c is None else (c.mean, c.ci_low, c.ci_high)

        _bars(ax, seats, conditions, value, percent=False, top=top)
        ax.set_xticklabels(seats)
        ax.set_ylabel("Drift = 1 − cos")
        ax.set_title(f"{dim}  (cheap)", fontsize=10)
    for ax in list(axes.flat)[len(dims):]:
        ax.set_axis_off()
    fig.suptitle("Persona drift per client seat (mean over dialogues of the seat's utterances t ≥ 1, "
                 "t 95% CI)")
    fig.tight_layout()
    return fig


_GROUP_RATES_CAPTION = (
    "Group dialogues: the share of each condition's dialogues with an impersonation, a pair that "
    "relays another's lines, an unanswered address and a two-speaker loop (Wilson 95% CI), and the "
    "mean per-dialogue shares (t 95% CI)."
)
_GROUP_ECHO_CAPTION = (
    "Who echoes whom: the mean copy share of each ordered pair of participants (row copies column) "
    "per condition, and in how many of their dialogues the pair relays."
)
_GROUP_DRIFT_CAPTION = "Persona drift per client seat and condition (cheap mode), with t 95% intervals."


def group_figures(metrics: Metrics, group: GroupFrames | None) -> list[ReportFigure]:
    """The group section's figures in its order (group_rates, group_echo_pairs, group_drift;
    ``group``: the rows behind the last two); none for a run without group dialogues."""
    if not has_group(metrics):
        return []
    return [
        ReportFigure.from_png("group_rates", _GROUP_RATES_CAPTION, _png(figure_group_rates(metrics))),
        ReportFigure.from_png("group_echo_pairs", _GROUP_ECHO_CAPTION, _png(figure_group_echo(group))),
        ReportFigure.from_png("group_drift", _GROUP_DRIFT_CAPTION, _png(figure_group_drift(group))),
    ]


_EXAMPLE_TEXT = {"impersonation": "{p} speaks as {o}", "echo": "{p} copies {o}",
                 "silence": "{p}, addressed by {o}, does not answer", "loop": "{p} and {o} alternate"}


def group_html(metrics: Metrics, frames: GroupFrames | None, fig: Callable[[str], str]) -> str:
    """The group section's HTML (runs with group dialogues; empty otherwise); ``fig(name)``
    embeds the figure of that name, as the page around it does."""
    g = metrics.group
    if g is None:
        return ""
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in g.notes)
    head = (
        "\n<h2>Group dialogues: role confusion</h2>"
        f"<p class='meta'>{g.dialogues} group dialogues, up to {g.participants_max} participants. "
        "Rates: share of dialogues a detector flags (Wilson 95% CI); means: per-dialogue values "
        "(Student-t 95% CI). Also in metrics.json (<code>group</code>), per_participant.parquet "
        "and per_pair.parquet.</p>"
    )
    if not g.dialogues:
        return head + f"<ul class='notes'>{notes}</ul>"
    rates = _table(
        ["detector", "condition", "dialogues", "flagged", "rate", "Wilson 95% CI"],
        [[r.metric, r.condition, r.n, r.n_flagged, r.rate, _ci(r.ci_low, r.ci_high)] for r in g.rates],
    )
    stats = _table(
        ["metric", "condition", "dialogues", "mean", "95% CI"],
        [[s.metric, s.condition, s.n, s.mean, _ci(s.ci_low, s.ci_high)] for s in g.stats],
    )
    people = _table(
        ["participant", "role", "condition", "dialogues", "utterances", "impersonations",
         "impersonation share", "95% CI", "addressed", "silences", "echo max", "drift (utterance)"],
        [[p.participant_id, p.role, p.condition, p.n_dialogues, p.n_utterances, p.impersonations,
          p.impersonation_share, _ci(p.impersonation_ci_low, p.impersonation_ci_high), p.addressed,
          p.silences, p.echo_max, p.drift_utterance] for p in g.by_participant],
    )
    pairs = group_pair_table(frames) if frames is not None else []
    pair_html = (
        _table(
            ["copier", "source", "condition", "dialogues", "mean copy share", "95% CI", "relays",
             "relay rate (Wilson 95% CI)"],
            [[r.participant_id, r.source_id, r.condition, r.dialogues, r.mean, _ci(r.ci_low, r.ci_high),
              r.relays, f"{r.relays / r.dialogues:.0%} {_ci(r.relay_ci_low, r.relay_ci_high)}"
              if r.dialogues else "—"]
             for r in pairs],
        )
        if pairs
        else "<p>No pairwise echo (per_pair.parquet not given).</p>"
    )
    drift = group_seat_drift(frames) if frames is not None else []
    drift_html = (
        _table(
            ["client seat", "dimension", "condition", "dialogues", "mean drift (t ≥ 1)", "95% CI"],
            [[r.participant_id, r.dimension, r.condition, r.dialogues, r.mean, _ci(r.ci_low, r.ci_high)]
             for r in drift],
        )
        if drift
        else "<p>No drift per client seat (no client seat spoke twice, or per_participant.parquet "
        "not given).</p>"
    )
    examples = "".join(
        f"<li>{html.escape(e.kind)} · <b>{html.escape(e.dialogue_id)}</b> "
        f"({html.escape(e.condition.upper())}), utterance {_fmt(e.turn_index)}: "
        + html.escape(_EXAMPLE_TEXT[e.kind].format(p=e.participant, o=e.other))
        + (f", score {e.score:.2f}" if e.score is not None else "")
        + f"<blockquote>{html.escape(e.evidence)}</blockquote></li>"
        for e in g.examples
    ) or "<li>Nothing was flagged.</li>"
    defs = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in g.definitions.items())
    return (
        f"{head}{fig('group_rates')}{rates}{stats}"
        f"<h3>Per participant</h3>{people}"
        f"<h3>Who echoes whom</h3>{fig('group_echo_pairs')}{pair_html}"
        f"<h3>Drift per client seat</h3>{fig('group_drift')}{drift_html}"
        f"<h3>Flagged (up to 10 per kind)</h3><ul>{examples}</ul>"
        f"<ul class='notes'>{defs}{notes}</ul>"
    )

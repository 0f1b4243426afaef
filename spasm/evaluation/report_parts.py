"""The eval report's drawing and table primitives, shared by its two modules.

:mod:`spasm.evaluation.report` (the two-party figures and the page) and
:mod:`spasm.evaluation.report_group` (the group section) both draw with these: condition
colours, a figure to PNG, a placeholder figure, number formatting and the HTML
tables. A module of its own so that neither report module imports the other's internals and
the two never form a cycle; not an API (the names stay private to the report).
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

_CONDITION_COLOURS = {"ecp": "#1f77b4", "concat": "#d62728", "quoted": "#ff7f0e"}
_EXTRA_COLOURS = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]


def _colour(condition: str, seen: list[str]) -> str:
    if condition in _CONDITION_COLOURS:
        return _CONDITION_COLOURS[condition]
    if condition not in seen:
        seen.append(condition)
    return _EXTRA_COLOURS[seen.index(condition) % len(_EXTRA_COLOURS)]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _empty(message: str) -> Figure:
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    return fig


def _or(value: float | None, fallback: float | None) -> float:
    if value is not None:
        return value
    return fallback if fallback is not None else math.nan


def _fmt(value: object, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        if value != 0 and abs(value) < 10**-digits:
            return f"{value:.1e}"
        return f"{value:.{digits}f}"
    return str(value)


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)

    def cell(c: object) -> str:
        # Numbers right-aligned (the default), words left-aligned.
        numeric = isinstance(c, (int, float)) or c is None or str(c).startswith(("[", "—"))
        cls = "" if numeric or " ± " in str(c) else ' class="l"'
        return f"<td{cls}>{html.escape(_fmt(c))}</td>"

    body = "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ci(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "—"
    return f"[{_fmt(low)}, {_fmt(high)}]"

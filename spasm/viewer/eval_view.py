"""``eval/metrics.json`` as the overview shows it: what is valid, and what is not.

The file is usually ``spasm eval``'s, but it may be an older version's, hand-edited, or another
tool's file of that name. The overview reads a few sections of it; each is kept only in the shape
the page reads (a table's rows as objects of plain values), and every part that is not is named in
``problems`` (the page says so) instead of failing the whole page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["EvalMetrics", "read_eval_metrics", "readable_metrics"]

#: The tables the overview shows: section -> (where its rows are, the fields each row shows).
_TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "echoing": (("echoing", "rates"), ("pairing", "condition", "n", "n_echoing", "rate", "ci_low",
                                       "ci_high", "by_client", "by_responder")),
    "drift": (("drift", "comparisons"), ("dimension", "pairing", "n_pairs", "mean_ecp",
                                         "mean_concat", "delta", "cohen_d", "p_ttest")),
    "separability": (("separability",), ("pairing", "condition", "n_conversations", "silhouette",
                                         "davies_bouldin", "intra_mean", "intra_sd")),
}
_SCALAR = (str, int, float, bool)


@dataclass
class EvalMetrics:
    """What the overview shows of ``eval/metrics.json`` (``data``: ``None`` when there is none or
    nothing of it can be read) and what it could not read (``problems``)."""

    data: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)


def _rows(value: Any, fields: tuple[str, ...], where: str, problems: list[str]) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{where} is not a list")
        return []
    rows, bad = [], 0
    for item in value:
        if not isinstance(item, dict):
            bad += 1
            continue
        row = {f: item.get(f) for f in fields}
        if any(v is not None and not isinstance(v, _SCALAR) for v in row.values()):
            bad += 1  # shown, with "–" for the values that are not plain numbers or text
            row = {f: v if isinstance(v, _SCALAR) else None for f, v in row.items()}
        rows.append(row)
    if bad:
        problems.append(f"{bad} of {len(value)} entries of {where} are not in the expected form")
    return rows


def readable_metrics(raw: Any) -> EvalMetrics:
    """The parts of a parsed ``metrics.json`` the overview can show (see the module)."""
    if not isinstance(raw, dict):
        return EvalMetrics(None, [f"it is a JSON {type(raw).__name__}, not an object"])
    problems: list[str] = []
    echo_raw = raw.get("echoing")
    if echo_raw is not None and not isinstance(echo_raw, dict):
        problems.append("echoing is not an object")
        echo_raw = None
    echo = echo_raw or {}
    method = echo.get("method")
    kappa = echo.get("kappa_human")
    if kappa is not None and (isinstance(kappa, bool) or not isinstance(kappa, int | float)):
        problems.append("echoing.kappa_human is not a number")
        kappa = None
    drift_raw = raw.get("drift")
    if drift_raw is not None and not isinstance(drift_raw, dict):
        problems.append("drift is not an object")
        drift_raw = None
    data: dict[str, Any] = {
        "echoing": {
            "method": method if isinstance(method, str) and method else "rule",
            "kappa_human": kappa,
            "rates": _rows(echo.get("rates"), _TABLES["echoing"][1], "echoing.rates", problems),
        },
        "drift": {"comparisons": _rows((drift_raw or {}).get("comparisons"), _TABLES["drift"][1],
                                       "drift.comparisons", problems)},
        "separability": _rows(raw.get("separability"), _TABLES["separability"][1], "separability",
                              problems),
    }
    return EvalMetrics(data, problems)


def read_eval_metrics(run_dir: Path) -> EvalMetrics:
    """``RUN_DIR/eval/metrics.json`` for the overview; never raises for its content."""
    path = Path(run_dir) / "eval" / "metrics.json"
    if not path.is_file():
        return EvalMetrics(None)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return EvalMetrics(None, [f"it cannot be read as JSON ({reason})"])
    return readable_metrics(raw)

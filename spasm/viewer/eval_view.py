"""``eval/metrics.json`` as the overview shows it: what is valid, and what is not.

The file is usually ``spasm eval``'s, but it may be an older version's, hand-edited, or another
tool's file of that name. The overview reads a few sections of it; each is kept only in the shape
the page reads (a table's rows as objects of plain values), and every part that is not is named in
``problems`` (the page says so) instead of failing the whole page.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from spasm.evaluation.metrics import EchoRate, PairedComparison, SeparabilityGroup

__all__ = ["EvalMetrics", "read_eval_metrics", "readable_metrics"]

_SCALAR = (str, int, float, bool)


def _is_scalar(annotation: Any) -> bool:
    """Whether a field's type is plain text, a number, a boolean, a literal or ``None``
    (or a union of them): a value a table cell shows."""
    if annotation in (*_SCALAR, type(None)):
        return True
    origin = get_origin(annotation)
    if origin is Literal:
        return True
    if origin in (Union, types.UnionType):
        return all(_is_scalar(a) for a in get_args(annotation))
    return False


def _row_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of a metrics model a table row keeps: its plain values, in the model's order."""
    return tuple(name for name, info in model.model_fields.items() if _is_scalar(info.annotation))


#: The rows of each table the overview shows: the fields of the metrics model of its rows
#: (:mod:`spasm.evaluation.metrics`, the one declaration of metrics.json).
_FIELDS: dict[str, tuple[str, ...]] = {
    "echoing": _row_fields(EchoRate),
    "drift": _row_fields(PairedComparison),
    "separability": _row_fields(SeparabilityGroup),
}


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
            "rates": _rows(echo.get("rates"), _FIELDS["echoing"], "echoing.rates", problems),
        },
        "drift": {"comparisons": _rows((drift_raw or {}).get("comparisons"), _FIELDS["drift"],
                                       "drift.comparisons", problems)},
        "separability": _rows(raw.get("separability"), _FIELDS["separability"], "separability",
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

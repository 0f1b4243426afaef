"""``spasm compare``: the ECP-vs-CONCAT and per-pairing tables, as plain text."""

from __future__ import annotations

import math

import pandas as pd

from spasm.evaluation.metrics import Metrics

__all__ = ["comparison_text"]


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


def comparison_text(metrics: Metrics) -> str:
    """Two tables: ΔDrift (ECP − CONCAT) per dimension and pairing; then per pairing ×
    condition the echoing rate and persona separability."""
    parts = [
        f"Run: {metrics.run_dir}   embedder: {metrics.embedder}   drift mode: "
        f"{metrics.drift.mode}   echoing: {metrics.echoing.method}"
    ]
    rows = [
        {
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
        for p in metrics.drift.comparisons
    ]
    parts.append("\nECP vs CONCAT — per-dialogue mean drift (client turns t >= 1), paired")
    if rows:
        parts.append(pd.DataFrame(rows).to_string(index=False))
    else:
        parts.append("  (no pairs) " + " ".join(metrics.drift.notes))

    sep = {(g.pairing, g.condition): g for g in metrics.separability}
    rows = []
    for r in metrics.echoing.rates:
        g = sep.get((r.pairing, r.condition))
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
            }
        )
    parts.append("\nPer pairing × condition — echoing (Wilson 95% CI) and persona separability")
    parts.append(pd.DataFrame(rows).to_string(index=False) if rows else "  (no dialogues)")
    return "\n".join(parts) + "\n"

"""The eval report's section on outcomes (issue 31): reliability over trials (pass^k and the
noise floor), and the simulated user's errors. Empty for a run that has none of them, so
other reports are unchanged. Its own module, beside :mod:`spasm.evaluation.report_group`,
drawing with :mod:`spasm.evaluation.report_parts`."""

from __future__ import annotations

import html

from spasm.evaluation.metrics import Metrics, ReliabilityMetrics
from spasm.evaluation.report_parts import _fmt, _table

__all__ = ["outcomes_html"]


def _reliability_html(r: ReliabilityMetrics) -> str:
    ks = list(range(1, r.trials + 1))
    headers = ["pairing", "condition", "scenario", "tasks", "dialogues", "flip share",
               *[f"pass^{k}" for k in ks], *[f"all-of-{k}" for k in ks],
               *[f"floor^{k}" for k in ks]]
    rows = []
    for row in r.rows:
        by_k = {p.k: p for p in row.pass_hat}
        rows.append([
            row.pairing, row.condition, row.scenario_id, row.tasks, row.dialogues,
            row.flip_share,
            *[by_k[k].unbiased if k in by_k else None for k in ks],
            *[by_k[k].all_of_k if k in by_k else None for k in ks],
            *[by_k[k].noise_floor if k in by_k else None for k in ks],
        ])
    defs = "".join(f"<li><b>{html.escape(k)}</b> (pass^k / all-of-k): {html.escape(v)}</li>"
                   for k, v in r.estimators.items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in r.notes)
    return (
        "<h2>Reliability over trials (pass^k)</h2>"
        f"<p class='meta'>{r.tasks} tasks × up to {r.trials} trials; a dialogue succeeds when "
        f"its <code>{html.escape(r.outcome)}</code> says so. flip share: tasks whose outcome "
        "differs between trials. floor^k: two runs of this size differ in pass^k by less than "
        f"this {_fmt(r.confidence, 2)} of the time (bootstrap, {r.bootstrap_replicates} "
        "replicates): a smaller difference between conditions is noise.</p>"
        f"{_table(headers, rows)}<ul class='notes'>{defs}{notes}</ul>"
    )


def outcomes_html(metrics: Metrics) -> str:
    """The section's HTML (``""`` when the run has neither trials nor judged simulator errors)."""
    parts = []
    if metrics.reliability is not None:
        parts.append(_reliability_html(metrics.reliability))
    return "".join(parts)

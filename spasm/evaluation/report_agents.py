"""The eval report's section on outcomes: reliability over trials (pass^k and the noise
floor), payload leaks, and the simulated user's judged errors. Empty for a run that has none of
them, so such a run's report has no outcomes section. Its own module, beside
:mod:`spasm.evaluation.report_group`, drawing with :mod:`spasm.evaluation.report_parts`."""

from __future__ import annotations

import html

from spasm.evaluation.metrics import (
    Metrics,
    PayloadLeakMetrics,
    ReliabilityMetrics,
    SimulatorErrorMetrics,
)
from spasm.evaluation.report_parts import _ci, _fmt, _table

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


def _simulator_html(s: SimulatorErrorMetrics) -> str:
    table = _table(
        ["pairing", "condition", "reviewed", "with an error", "critical", "share", "95% CI",
         "failed", "failed with a critical error", "share", "95% CI", "passed",
         "passed with critical_helped", "share", "95% CI"],
        [[r.pairing, r.condition, r.n, r.with_error, r.critical, r.critical_share,
          _ci(r.critical_ci_low, r.critical_ci_high), r.failed, r.failed_critical,
          r.failed_critical_share, _ci(r.failed_ci_low, r.failed_ci_high), r.passed,
          r.passed_helped, r.passed_helped_share, _ci(r.passed_ci_low, r.passed_ci_high)]
         for r in s.rates],
    )
    overall = next((r for r in s.rates if r.pairing == "all" and r.condition == "all"), None)
    tags = ", ".join(f"{html.escape(t)} {n}" for t, n in (overall.tags if overall else {}).items())
    examples = "".join(
        f"<li><b>{html.escape(e.dialogue_id)}</b> ({html.escape(e.condition.upper())}) utterance "
        f"{e.turn}: {html.escape(', '.join(e.tags))}, {html.escape(e.severity)} — "
        f"{html.escape(e.reason)}<blockquote>{html.escape(e.text)}</blockquote></li>"
        for e in s.examples)
    defs = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>"
                   for k, v in {**s.severities, **s.tags}.items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in s.notes)
    return (
        "<h2>The simulated user's errors (LLM-judged)</h2>"
        f"<p class='meta'>Judge {html.escape(s.judge)}: {s.reviewed} dialogues reviewed, "
        f"{s.calls} calls, {s.fallbacks} fallbacks. A failed dialogue with a critical "
        "simulator error may be the simulator's failure, not the agent's.</p>"
        f"{table}<p class='meta'>Errors by tag: {tags or 'none'}.</p>"
        + (f"<h3>Critical errors (up to 10)</h3><ul>{examples}</ul>" if examples else "")
        + f"<ul class='notes'>{defs}{notes}</ul>"
    )


def _leak_html(p: PayloadLeakMetrics) -> str:
    table = _table(
        ["pairing", "condition", "dialogues", "leaking", "rate", "Wilson 95% CI",
         "Client utterances", "spans"],
        [[r.pairing, r.condition, r.n, r.n_leaking, r.rate, _ci(r.ci_low, r.ci_high),
          r.utterances, r.spans] for r in p.rates],
    )
    examples = "".join(
        f"<li><b>{html.escape(e.dialogue_id)}</b> ({html.escape(e.condition.upper())}) utterance "
        f"{e.turn} ({html.escape(e.speaker)}) repeats <code>{html.escape(e.span)}</code> from "
        f"{html.escape(e.actor)}'s {html.escape(e.tool or 'event')}"
        f"<blockquote>{html.escape(e.text)}</blockquote></li>" for e in p.examples)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in p.notes)
    return (
        "<h2>Payload leaks (the simulated user repeats what it could not see)</h2>"
        f"<p class='meta'>A Client utterance leaks when it repeats a span of a tool event its "
        f"{html.escape(p.frame.upper())} frame would not show (strings and numbers of the "
        f"payloads, at least {p.min_chars} characters; longer texts as runs of {p.max_words} "
        f"words). {p.checked} dialogues checked. CONCAT shows every event; ECP and quoted "
        "show others' events only as their notice.</p>"
        f"{table}" + (f"<ul>{examples}</ul>" if examples else "")
        + (f"<ul class='notes'>{notes}</ul>" if notes else "")
    )


def outcomes_html(metrics: Metrics) -> str:
    """The section's HTML (``""`` when the run has neither trials nor judged simulator errors)."""
    parts = []
    if metrics.reliability is not None:
        parts.append(_reliability_html(metrics.reliability))
    if metrics.payload_leak is not None:
        parts.append(_leak_html(metrics.payload_leak))
    if metrics.simulator_errors is not None:
        parts.append(_simulator_html(metrics.simulator_errors))
    return "".join(parts)

"""The report's "Against people" section: each realism metric for the simulator and for people
side by side with the human–human spread, and the goal judge calibrated against the person
(:mod:`spasm.evaluation.human`). Empty for a run without people and without a human reference."""

from __future__ import annotations

import html

from spasm.evaluation.metrics import Metrics
from spasm.evaluation.report_parts import _fmt, _table

__all__ = ["human_html"]


def human_html(metrics: Metrics) -> str:
    """The section's HTML, or ``""`` when the evaluation had no people to compare with."""
    h = metrics.human
    if h is None:
        return ""
    source = (f"the people of <b>{html.escape(h.reference)}</b> ({h.n_human_reference} "
              "dialogues with a person)" if h.reference is not None else "")
    own = f"{h.n_human_run} dialogues of this run with a person" if h.n_human_run else ""
    where = " and ".join(p for p in (source, own) if p)
    table = _table(
        ["metric", "simulated (condition)", "simulated n", "simulated mean", "human n",
         "human mean", "gap", "human–human spread", "|gap| / spread"],
        [[s.metric, s.condition, s.n_simulated, s.simulated_mean, s.n_human, s.human_mean,
          s.gap, s.human_spread, s.gap_over_spread] for s in h.stats],
    )
    calibration = ""
    c = h.calibration
    if c is not None:
        calibration = "<h3>Goal judge vs the person</h3>" + _table(
            ["", "value"],
            [["dialogues with both verdicts", c.n], ["agreement", c.agreement],
             ["Cohen's κ", c.kappa], ["judge says met", c.judge_rate],
             ["person says met", c.person_rate], ["bias (judge − person)", c.bias],
             ["dialogues with a rating", c.n_rated],
             ["Spearman ρ (rating vs judge outcome)", c.spearman], ["p", c.spearman_p]],
        )
    forks = ""
    f = h.forks
    if f is not None:
        skipped = ", ".join(f"{n} {k}" for k, n in f.skipped.items()) or "none"
        forks = (
            "<h3>Forks: the simulator's next turn vs the person's, on the same prefix</h3>"
            + _table(["", "simulator", "person"],
                     [["words (mean)", f.words_simulated, f.words_human],
                      ["politeness marker (share)", f.politeness_simulated, f.politeness_human],
                      ["frustration marker (share)", f.frustration_simulated, f.frustration_human]])
            + f"<p class='meta'>{f.n_compared} of {f.n_forks} forks compared (not compared: "
            f"{html.escape(skipped)}); mean cosine of the two turns "
            f"{html.escape(_fmt(f.cosine))} [{html.escape(_fmt(f.cosine_ci_low))}, "
            f"{html.escape(_fmt(f.cosine_ci_high))}].</p>"
            + _table(["fork", "from", "turn", "simulator", "person", "cosine"],
                     [[e.dialogue_id, e.forked_from, e.forked_at, e.simulated, e.human, e.cosine]
                      for e in f.examples])
        )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in h.notes)
    return (
        "<h2>Against people</h2>"
        f"<p class='meta'>The simulator's dialogues against {where}. The human–human spread "
        f"(the mean gap between two random halves of the people, {h.splits} splits) is the "
        "ceiling: a |gap| / spread of 1 or less is as close as two groups of people are.</p>"
        f"{table}{calibration}{forks}"
        + (f"<ul class='notes'>{notes}</ul>" if notes else "")
    )

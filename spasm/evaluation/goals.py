"""Goal success of a run with scenarios (README, "Scenarios with goals"): the share of dialogues whose
goal the goal judge decided was met (``dialogues.goal_met``), per condition (all pairings),
per pairing × condition and per scenario × condition, each with a Wilson 95% interval
(:func:`spasm.evaluation.stats.wilson_interval`). The paired comparison of conditions on the
same personas, seeds and scenarios is ``goal_met`` in :mod:`spasm.evaluation.compare`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from spasm.evaluation.loader import Conversation
from spasm.evaluation.metrics import GoalMetrics, GoalRate
from spasm.evaluation.stats import finite, wilson_interval
from spasm.registry import condition_rank

__all__ = ["goal_metrics"]



def goal_metrics(conversations: Sequence[Conversation]) -> GoalMetrics | None:
    """Goal success rates, or ``None`` when no dialogue has a scenario."""
    convs = [c for c in conversations if c.scenario_id is not None]
    if not convs:
        return None
    groups: dict[tuple[str, str, str], list[bool | None]] = defaultdict(list)
    pairings = {c.pairing for c in convs}
    for c in convs:
        groups[("all", c.condition, "all")].append(c.goal_met)
        if len(pairings) > 1:
            groups[(c.pairing, c.condition, "all")].append(c.goal_met)
        groups[("all", c.condition, str(c.scenario_id))].append(c.goal_met)
    rates = []
    for (pairing, condition, scenario), values in sorted(
        groups.items(), key=lambda kv: (kv[0][2] != "all", kv[0][2], kv[0][0] != "all", kv[0][0],
                                        *condition_rank(kv[0][1]))
    ):
        decided = [v for v in values if v is not None]
        met = sum(decided)
        low, high = wilson_interval(met, len(decided))
        rates.append(GoalRate(
            pairing=pairing, condition=condition, scenario_id=scenario, n=len(decided), n_met=met,
            rate=met / len(decided) if decided else None, ci_low=finite(low), ci_high=finite(high),
            undecided=len(values) - len(decided),
        ))
    return GoalMetrics(rates=rates, scenarios=len({c.scenario_id for c in convs}))

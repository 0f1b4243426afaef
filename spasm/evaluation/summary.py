"""Per-group summaries of per-conversation verdicts: echoing rates, examples and agreement.

Rates are shares of echoing conversations per pairing × condition with a Wilson 95% interval;
agreement is Cohen's κ (rule vs judge, automatic vs majority human label).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

from spasm.evaluation.echoing import EchoVerdict
from spasm.evaluation.loader import Conversation
from spasm.evaluation.metrics import EchoExample, EchoRate
from spasm.evaluation.stats import finite, wilson_interval
from spasm.registry import condition_rank

__all__ = ["echo_examples", "echo_rate", "echo_rates", "group_key", "kappa"]


def group_key(item: tuple[tuple[str, str], object]) -> tuple[str, int, str]:
    """Sort key of a ``((pairing, condition), ...)`` item: pairing, then the condition in
    reporting order (:func:`spasm.registry.condition_rank`)."""
    (pairing, condition), _ = item
    return (pairing, *condition_rank(condition))


def echo_rate(
    pairing: str, condition: str, convs: list[Conversation], verdicts: Mapping[str, EchoVerdict]
) -> EchoRate:
    """The echoing rate of ``convs`` (one pairing × condition, or ``"all"``)."""
    vs = [verdicts[c.dialogue_id] for c in convs if c.dialogue_id in verdicts]
    k = sum(v.echoing for v in vs)
    low, high = wilson_interval(k, len(vs))
    return EchoRate(
        pairing=pairing,
        condition=condition,
        n=len(vs),
        n_echoing=k,
        rate=k / len(vs) if vs else None,
        ci_low=finite(low),
        ci_high=finite(high),
        by_client=sum(v.echoing and v.who == "client" for v in vs),
        by_responder=sum(v.echoing and v.who == "responder" for v in vs),
    )


def echo_rates(convs: list[Conversation], verdicts: Mapping[str, EchoVerdict]) -> list[EchoRate]:
    """One :class:`EchoRate` per pairing × condition, in reporting order."""
    groups: dict[tuple[str, str], list[Conversation]] = defaultdict(list)
    for c in convs:
        groups[(c.pairing, c.condition)].append(c)
    return [
        echo_rate(p, cond, members, verdicts)
        for (p, cond), members in sorted(groups.items(), key=group_key)
    ]


def echo_examples(
    convs: list[Conversation], verdicts: Mapping[str, EchoVerdict], limit: int = 10
) -> list[EchoExample]:
    """The ``limit`` highest-scoring echoing conversations with their evidence (for the report)."""
    info = {c.dialogue_id: c for c in convs}
    flagged = sorted((v for v in verdicts.values() if v.echoing), key=lambda v: -v.score)[:limit]
    return [
        EchoExample(
            dialogue_id=v.dialogue_id,
            pairing=info[v.dialogue_id].pairing,
            condition=info[v.dialogue_id].condition,
            who=v.who,
            score=v.score,
            evidence=v.evidence,
            method=v.method,
        )
        for v in flagged
    ]


def kappa(a: list[bool], b: list[bool]) -> float | None:
    """Cohen's κ of two label lists; ``None`` when undefined (< 2 items or one label only)."""
    from sklearn.metrics import cohen_kappa_score

    if len(a) < 2 or len(set(a) | set(b)) < 2:
        return None
    value = float(cohen_kappa_score(a, b))
    return value if math.isfinite(value) else None

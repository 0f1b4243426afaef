"""Echoing onset: at which utterance a conversation starts to echo.

The rule scores every utterance (:class:`~spasm.evaluation.echoing.TurnSignals`); those
per-turn scores are the evidence. A conversation's **onset** is the index (0-based, over all
its utterances, as ``turns.turn_index`` counts them) of the first utterance of the echoing
side whose turn score reaches the threshold. When the LLM judge decided echoing and no turn
of that side reaches the threshold, the onset is that side's highest-scoring utterance (the
judge gives no turn). Non-echoing conversations have no onset.

Per pairing × condition, the **onset curve** is the share of the group's conversations that
have started echoing by utterance t (onset ≤ t), over all of the group's conversations: a
cumulative incidence, so a conversation that ended before t keeps the status it ended with.
``at_risk[t]`` says how many conversations were still running at t. Salesforce's study of
echoing (2025) reports it rising after about seven turns; the curve shows where CONCAT
starts and whether ECP ever does.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence

from spasm.evaluation.echoing import DEFAULT_THRESHOLD, EchoVerdict
from spasm.evaluation.loader import Conversation
from spasm.evaluation.metrics import EchoOnsetCurve
from spasm.evaluation.summary import group_key

__all__ = ["onset_curves", "onset_turn", "turn_scores"]


def onset_turn(verdict: EchoVerdict, threshold: float = DEFAULT_THRESHOLD) -> int | None:
    """The utterance index at which ``verdict``'s conversation began to echo (``None``: never)."""
    if not verdict.echoing or verdict.who == "none":
        return None
    side = [s for s in verdict.turns if s.speaker == verdict.who]
    if not side:
        return None
    for signals in side:
        if signals.score >= threshold:
            return signals.index
    return max(side, key=lambda s: s.score).index


def turn_scores(verdict: EchoVerdict, n_utterances: int) -> list[float]:
    """The rule's echoing score of every utterance (NaN where a turn was not scored)."""
    scores = [math.nan] * n_utterances
    for signals in verdict.turns:
        if 0 <= signals.index < n_utterances:
            scores[signals.index] = round(signals.score, 4)
    return scores


def onset_curves(
    conversations: Sequence[Conversation], onsets: Mapping[str, int | None]
) -> list[EchoOnsetCurve]:
    """One onset curve per pairing × condition, in reporting order."""
    groups: dict[tuple[str, str], list[Conversation]] = defaultdict(list)
    for conv in conversations:
        groups[(conv.pairing, conv.condition)].append(conv)
    out: list[EchoOnsetCurve] = []
    for (pairing, condition), members in sorted(groups.items(), key=group_key):
        horizon = max(len(c.texts) for c in members)
        starts = [o for c in members if (o := onsets.get(c.dialogue_id)) is not None]
        n = len(members)
        out.append(
            EchoOnsetCurve(
                pairing=pairing,
                condition=condition,
                n=n,
                n_echoing=len(starts),
                share_by_turn=[sum(o <= t for o in starts) / n for t in range(horizon)],
                at_risk=[sum(len(c.texts) > t for c in members) for t in range(horizon)],
                median_onset=float(statistics.median(starts)) if starts else None,
                first_onset=min(starts) if starts else None,
            )
        )
    return out

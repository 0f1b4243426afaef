"""Echoing onset: the utterance where echoing begins, per dialogue and as a curve per group."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spasm.dataset.synthetic import write_run
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.echoing import EchoVerdict, TurnSignals, rule_echoing
from spasm.evaluation.loader import Conversation
from spasm.evaluation.onset import onset_curves, onset_turn, turn_scores
from spasm.evaluation.testing import LookupEmbedder

register_embedder("lookup", LookupEmbedder)

ADVICE = (
    "Try resetting the router by holding the small button for ten seconds, then wait for the "
    "lights to settle before reconnecting your laptop."
)
# The Client opens, the Responder advises at utterance 3, the Client parrots it at utterance 4.
PARROT = [
    "My home internet keeps dropping whenever my kids start streaming films in the evening.",
    "That sounds annoying. How many devices are usually connected when it happens?",
    "Maybe six or seven, phones and two tablets and the television downstairs.",
    ADVICE,
    ADVICE,
    "Did that help with the dropping connection at all this evening?",
]
CALM = [
    "My home internet keeps dropping whenever my kids start streaming films in the evening.",
    "That sounds annoying. How many devices are usually connected when it happens?",
    "Maybe six or seven, phones and two tablets and the television downstairs.",
    ADVICE,
    "Okay, I held the button and the lights went green again, it seems stable now.",
    "Great, let me know if it drops again tomorrow evening.",
]


def _conv(did: str, texts: list[str], condition: str = "concat") -> Conversation:
    speakers = tuple("client" if i % 2 == 0 else "responder" for i in range(len(texts)))
    return Conversation(did, "p0", 0, condition, "a/b", "A", speakers, tuple(texts))


def _orthogonal(n: int) -> np.ndarray:
    return np.eye(n, 16, dtype=np.float32)  # no embedding similarity: copy and cues decide


def test_onset_is_the_first_utterance_of_the_echoing_side_over_the_threshold() -> None:
    verdict = rule_echoing(_conv("d", PARROT), _orthogonal(len(PARROT)))
    assert verdict.echoing and verdict.who == "client"
    assert onset_turn(verdict) == 4
    scores = turn_scores(verdict, len(PARROT))
    assert len(scores) == 6 and scores[4] >= 0.5 and max(scores[:4]) < 0.5


def test_a_conversation_that_never_echoes_has_no_onset() -> None:
    verdict = rule_echoing(_conv("d", CALM), _orthogonal(len(CALM)))
    assert not verdict.echoing and onset_turn(verdict) is None


def test_a_judge_verdict_below_the_rule_threshold_starts_at_the_sides_highest_turn() -> None:
    turns = [
        TurnSignals(0, "client", 0.0, 0.0, [], 0.1),
        TurnSignals(1, "responder", 0.0, 0.0, [], 0.4),
        TurnSignals(2, "client", 0.0, 0.0, [], 0.3),
        TurnSignals(4, "client", 0.0, 0.0, [], 0.2),
    ]
    judged = EchoVerdict("d", True, "client", 1.0, 0.3, 0.4, [], "judge", turns)
    assert onset_turn(judged) == 2


def test_onset_curve_is_the_cumulative_share_of_the_groups_dialogues() -> None:
    convs = [_conv("a", PARROT), _conv("b", CALM), _conv("c", CALM[:4]), _conv("e", CALM, "ecp")]
    curves = onset_curves(convs, {"a": 4, "b": None, "c": None, "e": None})
    ecp, concat = curves
    assert (ecp.condition, concat.condition) == ("ecp", "concat")
    assert concat.n == 3 and concat.n_echoing == 1
    assert concat.share_by_turn == pytest.approx([0, 0, 0, 0, 1 / 3, 1 / 3])
    assert concat.at_risk == [3, 3, 3, 3, 2, 2]
    assert concat.median_onset == 4 and concat.first_onset == 4
    assert ecp.share_by_turn == [0.0] * 6 and ecp.median_onset is None


@pytest.mark.e2e
def test_eval_writes_per_turn_evidence_and_onset_curves(tmp_path: Path) -> None:
    personas = [{"persona_id": "p0", "card": "A parent with a flaky router."}]
    run = write_run(
        tmp_path / "run",
        personas,
        [
            {"dialogue_id": "d-ecp", "persona_id": "p0", "condition": "ecp", "seed": 1, "texts": CALM},
            {"dialogue_id": "d-concat", "persona_id": "p0", "condition": "concat", "seed": 1,
             "texts": PARROT},
        ],
    )
    m = evaluate(run, embedder="lookup", progress=False)
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    assert per.loc["d-concat", "echo_onset_turn"] == 4
    assert pd.isna(per.loc["d-ecp", "echo_onset_turn"])
    assert len(per.loc["d-concat", "echo_turn_scores"]) == 6
    curves = {c.condition: c for c in m.echoing.onset}
    assert curves["concat"].share_by_turn == [0, 0, 0, 0, 1, 1]
    assert curves["ecp"].n_echoing == 0
    assert "Echoing onset" in (run / "eval" / "report.html").read_text()

"""Echoing on real text with the real local embedder, the judge path, and the rates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spasm.config import BackendConfig
from spasm.dataset.synthetic import write_run
from spasm.evaluation import evaluate
from spasm.evaluation.echoing import role_cues, rule_echoing
from spasm.evaluation.embeddings import LocalOnnxEmbedder
from spasm.evaluation.loader import Conversation
from spasm.evaluation.stats import wilson_interval
from spasm.testing import FaultPlan, TestServer

NORMAL = [
    "Hi, my washing machine stopped spinning last week and it's only eight months old. "
    "Is this covered by the warranty?",
    "I'm sorry to hear that. Yes, a machine under twelve months old is covered by our standard "
    "warranty. Could you give me the model number and the date of purchase?",
    "Sure, it's the WM-4500, bought on March 3rd at the Leeds store. I have the receipt "
    "somewhere. Do I need it?",
    "Thank you. The receipt helps, but we can also find the purchase from your loyalty account. "
    "I can book a technician visit for you. Would Tuesday or Thursday work?",
    "Thursday is better, I work from home that day. Will they fix it there or take it away? "
    "I can't be without a washer for long, I have two kids.",
    "The technician will try to repair it on site. If a part is needed, we'll order it and "
    "you'll have a loaner machine within two days. I've booked Thursday between 9 and 12.",
    "Okay, that's a relief. Thanks for sorting this out so quickly.",
    "You're welcome! You'll get a confirmation email shortly. Is there anything else I can help with?",
    "No, that's all. Bye!",
]

# A frustrated Client who tells the helper what to do is still in role.
ANGRY = [
    "This is the third time I'm writing. My broadband drops every evening and nobody fixes it.",
    "I apologise for the trouble. Could you tell me roughly when the connection drops?",
    "Every night around 8. You should have fixed this weeks ago. I work from home, I need it.",
    "I understand. I can see an open fault on your line; an engineer is scheduled for Friday.",
    "Friday? That's four more days. I want a discount on this month's bill for the outages.",
    "That's fair. I've applied a credit of 15 pounds to your account for the disruption.",
    "Fine. If it's not fixed on Friday I'm cancelling the contract.",
]

# From its second turn on, the Client repeats the Responder's advice in the Responder's voice.
ECHO = [
    "Hi, my washing machine stopped spinning last week and it's only eight months old. "
    "Is this covered by the warranty?",
    "I'm sorry to hear that. Yes, it's covered by our standard warranty. First, check that the "
    "drum isn't overloaded and that the drain filter is clean. Then run a spin-only cycle. If it "
    "still doesn't spin, we can send a technician.",
    "Thanks. I understand your concern about the spin cycle. You should check that the drum "
    "isn't overloaded and that the drain filter is clean, then run a spin-only cycle. Is there "
    "anything else I can help you with?",
    "Thank you. Did you manage to check the drain filter? If it still does not spin, I can book "
    "a technician for you.",
    "Here are some steps you can take:\n1. Make sure the drum isn't overloaded.\n2. Clean the "
    "drain filter.\n3. Run a spin-only cycle.\nIf it still doesn't spin, we can send a "
    "technician. How can I help you further?",
    "Thanks for the steps. Shall I book the technician visit for Thursday?",
    "I'd recommend booking the technician visit for Thursday. Have you tried running a spin-only "
    "cycle? Let me know if there's anything else I can help with.",
]

# The degenerate loop small models fall into (cf. SmolLM2-135M): both sides repeat each other.
LOOP = [
    "Hello, I need advice about the financial report my team is preparing for the next quarter.",
    "Hey, I'm happy to help with your team's financial performance and other projects. I've been "
    "working on a report about your company's finances for a while now.",
    "Hey, I'm happy to help with your team's financial performance and other projects. I've been "
    "working on a report about your company's finances for a while now. Can you share it?",
    "Hey, I'm happy to help with your team's financial performance and other projects. Can you "
    "share the report about your company's finances if you're interested?",
]


def _conv(texts: list[str], did: str = "d") -> Conversation:
    speakers = tuple("client" if i % 2 == 0 else "responder" for i in range(len(texts)))
    return Conversation(did, "p1", 0, "concat", "a/b", "", speakers, tuple(texts))


@pytest.fixture(scope="module")
def local() -> LocalOnnxEmbedder:
    return LocalOnnxEmbedder()


def test_client_repeating_the_responders_advice_is_flagged(local: LocalOnnxEmbedder) -> None:
    verdict = rule_echoing(_conv(ECHO), local.embed(ECHO))
    assert verdict.echoing and verdict.who == "client"
    assert verdict.client_score >= 0.5 > verdict.responder_score
    joined = " ".join(verdict.evidence)
    assert "client turn 1" in joined and "drain filter is clean" in joined


def test_a_repetition_loop_is_flagged_as_parroting(local: LocalOnnxEmbedder) -> None:
    verdict = rule_echoing(_conv(LOOP), local.embed(LOOP))
    assert verdict.echoing and verdict.who == "client"
    (turn,) = [s for s in verdict.turns if s.index == 2]
    assert turn.copy > 0.9 and turn.score >= turn.copy - 0.1 >= 0.5  # parroting suffices
    assert any("repeats the responder" in e for e in verdict.evidence)


@pytest.mark.parametrize("texts", [NORMAL, ANGRY], ids=["normal", "angry-client"])
def test_a_normal_conversation_is_not_flagged(local: LocalOnnxEmbedder, texts: list[str]) -> None:
    verdict = rule_echoing(_conv(texts), local.embed(texts))
    assert not verdict.echoing and verdict.who == "none" and verdict.evidence == []
    assert verdict.score < 0.5


def test_role_cues() -> None:
    assert sorted(role_cues("Have you tried restarting it? I'd recommend that.", "client")) == [
        "Have you tried",
        "I'd recommend",
    ]
    assert role_cues("Steps:\n1. Unplug it.\n2. Wait.", "client") == ["a numbered/bulleted list of steps"]
    assert role_cues("My washing machine is broken and I'm annoyed.", "client") == []
    assert role_cues("I\u2019m sorry for any inconvenience. It\u2019s a pleasure to help!", "client") == [
        "sorry for any inconvenience",
        "It's a pleasure to",
    ]
    assert role_cues("Can you help me? What should I do?", "responder") == [
        "Can you help me",
        "What should I do",
    ]


def test_wilson_interval_matches_known_values() -> None:
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)


def _echo_run(tmp_path: Path) -> Path:
    persona = {"persona_id": "p1", "concern": "repair", "emotion": "annoyed", "card": "A customer."}
    dialogues = [
        {"dialogue_id": "n1", "persona_id": "p1", "condition": "ecp", "texts": NORMAL},
        {"dialogue_id": "n2", "persona_id": "p1", "condition": "ecp", "texts": ANGRY},
        {"dialogue_id": "e1", "persona_id": "p1", "condition": "concat", "texts": ECHO},
        {"dialogue_id": "n3", "persona_id": "p1", "condition": "concat", "texts": NORMAL[:5]},
    ]
    return write_run(tmp_path, [persona], dialogues)


def test_echoing_rates_per_pairing_and_condition(tmp_path: Path) -> None:
    m = evaluate(_echo_run(tmp_path), write=False, progress=False)
    rates = {(r.pairing, r.condition): r for r in m.echoing.rates}
    concat, ecp = rates[("smol/smol", "concat")], rates[("smol/smol", "ecp")]
    assert (concat.n, concat.n_echoing, concat.by_client) == (2, 1, 1)
    assert (ecp.n, ecp.n_echoing) == (2, 0)
    assert concat.rate == 0.5 and concat.ci_low is not None and concat.ci_high is not None
    assert concat.ci_low < 0.5 < concat.ci_high
    assert m.echoing.overall.n == 4 and m.echoing.overall.n_echoing == 1
    assert [e.dialogue_id for e in m.echoing.examples] == ["e1"]


def _judge_config(server: TestServer) -> BackendConfig:
    # One attempt per call: a failed call falls back at once instead of after the backoff.
    return BackendConfig(kind="openai", base_url=server.base_url, model="judge-m", max_attempts=1)


def test_judge_verdicts_and_fallback_to_the_rule(tmp_path: Path) -> None:
    run = _echo_run(tmp_path)

    def judge(body: dict[str, Any]) -> str:
        messages = body["messages"]
        assert "ECHOING" in messages[0]["content"]
        convo = messages[1]["content"]
        if "You should have fixed" in convo:  # the angry one: always inconsistent -> fallback
            return json.dumps({"echoing": True, "who": "none", "evidence": []})
        if "Here are some steps" in convo:
            return json.dumps(
                {"echoing": True, "who": "client", "evidence": ["Here are some steps you can take"]}
            )
        return json.dumps({"echoing": False, "who": "none", "evidence": []})

    with TestServer(reply=judge) as srv:
        m = evaluate(run, judge=True, llm_config=_judge_config(srv), write=False, progress=False)
        bodies = srv.requests
    assert m.echoing.method == "judge"
    assert m.echoing.judge_calls == 5 and m.echoing.judge_fallbacks == 1
    assert {b["temperature"] for b in bodies} == {0.3} and {b["model"] for b in bodies} == {"judge-m"}
    (example,) = m.echoing.examples
    assert example.dialogue_id == "e1" and example.method == "judge"
    assert example.evidence == ["Here are some steps you can take"]
    assert m.echoing.kappa_rule_vs_judge == pytest.approx(1.0)
    calls = pd.read_parquet(run / "calls.parquet")
    assert set(calls.role) == {"eval_judge"} and len(calls) == 5
    angry = calls[calls.dialogue_id == "n2"]
    assert list(angry.outcome) == ["invalid_output", "invalid_output"]
    assert angry.error.str.contains('"who" must be').all()


def test_a_failing_judge_falls_back_to_the_rule_everywhere(tmp_path: Path) -> None:
    run = _echo_run(tmp_path)
    with TestServer(FaultPlan(rate_500=1.0)) as srv:  # every call fails: all fall back
        m = evaluate(run, judge=True, llm_config=_judge_config(srv), write=False, progress=False)
    assert m.echoing.judge_calls == 4 and m.echoing.judge_fallbacks == 4
    assert m.echoing.overall.n_echoing == 1  # the rule's
    assert {e.method for e in m.echoing.examples} == {"rule"}
    calls = pd.read_parquet(run / "calls.parquet")
    assert set(calls.outcome) == {"server_error"} and len(calls) == 4


def test_human_annotations_give_kappa(tmp_path: Path) -> None:
    run = _echo_run(tmp_path)
    pd.DataFrame(
        {
            "dialogue_id": ["e1", "e1", "n1", "n2", "n3"],
            "annotator": ["a", "b", "a", "a", "a"],
            "echoing": [True, True, False, False, True],
        }
    ).to_parquet(run / "annotations.parquet")
    m = evaluate(run, write=False, progress=False)
    assert m.echoing.kappa_human == pytest.approx(0.5)
    assert m.echoing.human_note and "labelled 4 dialogue(s)" in m.echoing.human_note

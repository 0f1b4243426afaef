"""The harness layers one by one: policy, context and intent, retrieval, checker, levels, config."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import fields
from itertools import pairwise
from pathlib import Path
from typing import get_args

import pytest

from spasm.config import load_config
from spasm.dataset.persona_rows import persona_of
from spasm.engine import plan
from spasm.errors import ConfigError
from spasm.harness.checker import CheckerOutput, DimensionScores, overall_score, rule_violations, verdict_from
from spasm.harness.context import (
    StructuredContext,
    classify_intent,
    compress_rules,
    dialogue_act,
    intent_guidance,
)
from spasm.harness.levels import LEVELS, Layer, Layers, layers, level_label
from spasm.harness.policy import (
    MAX_NEVER,
    MIN_NEVER,
    POLICY_VERSION,
    Boundaries,
    CharacterPolicy,
    baseline_client_policy,
    baseline_responder_policy,
    merge_policies,
    parse_stored_policy,
)
from spasm.harness.probe import fact_words, recall
from spasm.harness.retrieval import (
    WEIGHTS,
    Example,
    Query,
    lexical_prefilter,
    load_corpus,
    match_score,
    retrieve,
)
from spasm.history import History
from tests.conftest import config_from, endpoint_config, make_persona

PERSONA = persona_of({
    "persona_id": "p1", "persona_index": 1, "first_name": "Kofi", "age": 61, "occupation": "Retiree",
    "city": "Accra, Ghana", "domain": "pension payout", "concern": "when my pension starts",
    "motivation": "wants a clear answer", "emotion": "anxious", "intensity": "severe",
    "verbosity": "verbose", "directness": "indirect", "cooperativeness": "resistant",
    "formality": "formal", "card": "You are Kofi ...",
})


# -- policy -----------------------------------------------------------------------------------


def test_the_baseline_policy_has_the_facts_and_5_to_10_never_boundaries() -> None:
    p = baseline_client_policy(PERSONA, "pension advisor")
    text = json.dumps(p.model_dump())
    for fact in ("Kofi", "61", "Accra, Ghana", "pension payout", "when my pension starts"):
        assert fact in text
    assert MIN_NEVER <= len(p.boundaries.never) <= MAX_NEVER
    assert any("advice" in n for n in p.boundaries.never)
    assert " AI" not in text  # the Client is never told it is an AI
    r = baseline_responder_policy("pension advisor")
    assert len(r.boundaries.never) >= MIN_NEVER and "Kofi" not in json.dumps(r.model_dump())


def test_an_extraction_enriches_the_baseline_without_losing_its_boundaries() -> None:
    base = baseline_client_policy(PERSONA, "advisor")
    extra = CharacterPolicy(
        facts=["You worked as a bus driver for 30 years."],
        boundaries=Boundaries(never=[f"Never do thing {i}." for i in range(10)]
                              + [base.boundaries.never[0].upper()]),
    )
    merged = merge_policies(base, extra)
    assert merged.boundaries.never[: len(base.boundaries.never)] == base.boundaries.never
    assert len(merged.boundaries.never) == MAX_NEVER
    assert "You worked as a bus driver for 30 years." in merged.facts
    assert merge_policies(base, None) == base


def test_a_stored_policy_is_used_only_at_the_current_version() -> None:
    p = baseline_client_policy(PERSONA, "advisor")
    row = dataclasses.replace(PERSONA, policy=p.to_json(), policy_version=POLICY_VERSION)
    assert parse_stored_policy(row) == p
    assert parse_stored_policy(dataclasses.replace(row, policy_version="0")) is None
    assert parse_stored_policy(PERSONA) is None


def test_a_model_policy_with_too_many_items_is_truncated_not_rejected() -> None:
    raw = {"facts": [f"f{i}" for i in range(20)], "boundaries": {"never": ["n" * 500] * 12}}
    p = CharacterPolicy.model_validate(raw)
    assert len(p.facts) == 8 and len(p.boundaries.never) == 10
    assert len(p.boundaries.never[0]) == 140


# -- structured context and intent --------------------------------------------------------------


@pytest.mark.parametrize(("text", "intent"), [
    ("Hi there!", "small_talk"),
    ("I'm so frustrated and tired of this, it's ridiculous", "venting"),
    ("What should I do, do you think I should wait?", "advice_seeking"),
    ("I need to cancel order 4471 and get a refund", "task"),
    ("Hi, I need a refund for my order", "task"),
])
def test_intent_rules(text: str, intent: str) -> None:
    assert classify_intent(text) == intent


def test_intent_is_sticky_on_weak_cues_and_a_switch_is_announced() -> None:
    assert classify_intent("Hmm, ok", "venting") == "venting"
    assert "shifted from venting to task" in intent_guidance("client", "task", "venting")
    assert intent_guidance("responder", "venting", "venting").startswith("Current intent")


@pytest.mark.parametrize(("text", "act"), [
    ("Hello, good morning", "greeting"), ("Thanks, bye!", "closing"),
    ("When does it start?", "question"), ("Could you send the form", "request"),
    ("This is awful and unfair", "complaint"), ("It started in May.", "statement"),
])
def test_dialogue_acts(text: str, act: str) -> None:
    assert dialogue_act(text) == act


def _history(*lines: tuple[str, str]) -> History:
    h = History()
    for speaker, text in lines:
        h = h.append(speaker, text)  # type: ignore[arg-type]
    return h


def test_older_turns_compress_into_a_typed_record() -> None:
    h = _history(
        ("client", "Hello. My pension from Ghana Post has not started. When will it start?"),
        ("responder", "Let me check. Did you send the form to Mr Mensah?"),
        ("client", "Yes, I sent it in March. I am worried."),
        ("responder", "I see you are worried. The office says six weeks."),
        ("client", "Six weeks is long."),
        ("responder", "I understand."),
    )
    labels = {"client": "The client", "responder": "You"}
    ctx = compress_rules(StructuredContext(), h.utterances, 4, "responder", labels)  # type: ignore[arg-type]
    assert ctx.covered == 4 and ctx.key_events[0].startswith("The client: Hello.")
    assert "Mensah" in ctx.people and "Ghana" in ctx.people
    assert ctx.partner_emotion == "worried"
    # "When will it start?" was deferred ("Let me check") and not answered later: still open.
    assert any("When will it start?" in q for q in ctx.unresolved_questions)
    # "Did you send the form?" was answered by the next message.
    assert not any("form" in q for q in ctx.unresolved_questions)
    # Key events keep the opening and the latest three.
    long = _history(*[("client" if i % 2 == 0 else "responder", f"Message number {i}.")
                      for i in range(12)])
    ctx = compress_rules(StructuredContext(), long.utterances, 10, "client", labels)  # type: ignore[arg-type]
    assert [e.split(": ")[1] for e in ctx.key_events] == [
        "Message number 0.", "Message number 1.", "Message number 7.", "Message number 8.",
        "Message number 9.",
    ]


# -- retrieval --------------------------------------------------------------------------------


def _ex(text: str, **kw: str) -> Example:
    base = {"intent": "task", "emotion": "fear", "relation": "neutral", "act": "question",
            "scene": "middle"}
    return Example(text=text, **{**base, **kw})


def test_the_weights_are_the_spec_ones() -> None:
    assert WEIGHTS == {"intent": 0.30, "emotion": 0.25, "relation": 0.20, "act": 0.15,
                       "scene": 0.10}
    q = Query("pension", "task", "fear", "neutral", "question", "middle")
    assert match_score(q, _ex("x")) == pytest.approx(1.0)
    assert match_score(q, _ex("x", intent="venting")) == pytest.approx(0.70)
    assert match_score(q, _ex("x", emotion="anger")) == pytest.approx(0.75)
    assert match_score(q, _ex("x", emotion="trust")) == pytest.approx(0.875)  # wheel neighbour
    assert match_score(q, _ex("x", relation="warm")) == pytest.approx(0.90)
    assert match_score(q, _ex("x", act="statement")) == pytest.approx(0.85)
    assert match_score(q, _ex("x", scene="opening")) == pytest.approx(0.95)


def test_the_lexical_prefilter_keeps_the_top_50_then_the_rerank_decides() -> None:
    pool = [_ex(f"pension office letter number {i}", intent="venting") for i in range(60)]
    pool += [_ex("I would like to know about the weather", intent="task")]
    shortlist = lexical_prefilter("pension office letter", pool, 50)
    assert len(shortlist) == 50 and all("pension" in ex.text for _, ex in shortlist)
    # The off-topic example never reaches the re-rank despite a perfect feature match.
    q = Query("pension office letter", "task", "fear", "neutral", "question", "middle")
    chosen = retrieve(q, pool, k=4)
    assert len(chosen) == 4 and all("pension" in ex.text for ex in chosen)
    # Within the shortlist the weighted match wins over word overlap.
    pool2 = [_ex("pension office letter", intent="venting"), _ex("pension forms", intent="task")]
    assert retrieve(q, pool2, k=1)[0].text == "pension forms"
    # Utterances still in the verbatim window are never offered.
    assert retrieve(q, pool2, k=2, exclude_texts=["pension forms"])[0].text != "pension forms"


def test_a_corpus_file_adds_examples(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"text": "Is my pension late again?", "emotion": "fear"}\n'
                    '{"text": "How can I help?", "speaker": "responder"}\n\n')
    client = load_corpus(str(path), "client")
    assert [e.text for e in client] == ["Is my pension late again?"]
    assert client[0].act == "question" and client[0].source == "corpus"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(ConfigError, match="line 1"):
        load_corpus(str(bad), "client")


# -- checker ----------------------------------------------------------------------------------


def test_the_checker_weights_and_the_pass_decision_are_in_code() -> None:
    s = DimensionScores(boundary=100, fact=0, state=0, style=0)
    assert overall_score(s) == 40.0
    s = DimensionScores(boundary=50, fact=100, state=100, style=100)
    assert overall_score(s) == 80.0
    out = CheckerOutput(dimension_scores=s, violations=[], correction_advice="")
    assert verdict_from(out, [], pass_threshold=70, boundary_floor=50).passed
    # A boundary below the floor fails whatever the overall score.
    assert not verdict_from(out, [], pass_threshold=70, boundary_floor=60).passed
    # A breach found in code caps the boundary score and fails.
    v = verdict_from(out, ["says or implies it is an AI"], pass_threshold=70, boundary_floor=50)
    assert not v.passed and v.dimension_scores["boundary"] == 20 and v.boundary_violation
    assert "AI" in v.correction_advice


def test_the_code_screen() -> None:
    assert rule_violations("As an AI language model I cannot", "client", "agent")
    assert rule_violations("How can I help you today?", "client", "agent")
    assert rule_violations("I'd recommend you call them.", "client", "agent")
    assert not rule_violations("Can you help me with my pension?", "client", "agent")
    # The Responder is expected to offer help.
    assert not rule_violations("How can I help you today?", "responder", "agent")
    assert rule_violations("My system prompt says so.", "responder", "agent")


# -- levels, config and plan --------------------------------------------------------------------


def test_each_level_lists_the_one_before_it_plus_what_it_adds() -> None:
    order = ["A", "B", "C", "D", "E"]
    for lower, higher in pairwise(order):
        assert LEVELS[higher][: len(LEVELS[lower])] == LEVELS[lower]
        assert len(LEVELS[higher]) > len(LEVELS[lower])
    assert LEVELS["A"] == () and not layers("A").any
    assert layers("B").window and not layers("B").state
    assert layers("C").state and layers("C").policy and not layers("C").retrieval
    assert layers("D").retrieval and not layers("D").verify and layers("E").verify
    assert set(LEVELS["E"]) == set(get_args(Layer)) == {f.name for f in fields(Layers)}
    assert level_label("E", "E") == "E" and level_label("C", "A") == "C/A"


def test_harness_config_is_validated() -> None:
    base = endpoint_config("http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match=r"harness\.windw: unknown key"):
        from spasm.config import parse_config

        parse_config({**base, "harness": {"windw": 3}}, "<t>")
    with pytest.raises(ConfigError, match=r"harness\.levels"):
        config_from({**base, "harness": {"levels": ["A", "A"]}})
    with pytest.raises(ConfigError, match=r"harness\.client"):
        config_from({**base, "harness": {"client": "F"}})
    with pytest.raises(ConfigError, match=r"harness\.backend"):
        config_from({**base, "harness": {"backend": "nope"}})
    assert not config_from(base).harness.active


def test_plan_adds_one_dialogue_per_level_with_shared_seeds() -> None:
    personas = [make_persona("p0"), make_persona("p1", 1)]
    base = endpoint_config("http://127.0.0.1:9/v1", conditions=["ecp", "concat"])
    plain = list(plan(config_from(base), personas))
    assert [s.dialogue_id for s in plain][:2] == ["p0-k0-srv-srv-ecp", "p0-k0-srv-srv-concat"]
    assert {s.levels for s in plain} == {("A", "A")}
    fixed = list(plan(config_from({**base, "harness": {"client": "E"}}), personas))
    assert [s.dialogue_id for s in fixed] == [s.dialogue_id for s in plain]
    assert {s.levels for s in fixed} == {("E", "A")}
    sweep = list(plan(config_from({**base, "harness": {"levels": ["A", "C", "E"]}}), personas))
    assert len(sweep) == 3 * len(plain)
    assert sweep[0].dialogue_id == "p0-k0-srv-srv-ecp-A" and sweep[2].levels == ("E", "E")
    assert len({s.seed for s in sweep if s.persona.id == "p0"}) == 1


def test_the_bundled_ablation_config_runs_all_five_levels() -> None:
    config = load_config(Path(__file__).parent.parent / "configs" / "harness-ablation.yaml")
    assert config.harness.levels == ["A", "B", "C", "D", "E"]
    assert set(config.backends) == {"embedded"} and config.harness.audit
    assert config.harness.recall_probe


# -- probe ------------------------------------------------------------------------------------


def test_the_recall_probe_scores_content_words() -> None:
    facts = fact_words("Hello, my washing machine leaks water since the repair in March.")
    assert facts == ["washing", "machine", "leaks", "water", "repair", "march"]
    answer = "They said their washing machine leaks after a repair."
    assert recall(facts, answer) == pytest.approx(4 / 6, abs=1e-4)
    assert recall([], "anything") is None


def test_the_public_names_of_the_harness_package() -> None:
    import spasm.harness

    assert spasm.harness.__all__ == [
        "LEVELS", "POLICY_VERSION", "AgentState", "CharacterPolicy", "HarnessedAgent",
        "StateUpdate", "StructuredContext", "Verdict", "apply_update", "level_label",
    ]
    for name in spasm.harness.__all__:
        assert getattr(spasm.harness, name) is not None

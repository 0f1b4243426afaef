"""Persona probes (``harness.persona_probes``) and Q&A consistency: after the dialogue the Client
is asked questions about itself built from its persona fields, the answers are stored on its last
turn, and ``spasm eval --consistency`` judges them against the card.

Runs go through the real engine and openai SDK against the loopback test server; tables are read
back from Parquet.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest

from spasm.dataset.columns import PersonaProbe, dump_probes, load_persona_probes, load_probes
from spasm.dataset.persona_rows import persona_of
from spasm.engine import Engine
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.testing import LookupEmbedder
from spasm.harness.measure import persona_questions
from spasm.testing import TestServer
from spasm.testing.server import default_reply
from tests.conftest import config_from, endpoint_config, make_persona

register_embedder("lookup", LookupEmbedder)

PREAMBLE = "Pause the conversation for a moment. Answer as yourself"


def _answer(body: dict[str, Any]) -> str:
    """Persona probes get ``ANSWER to <question>``; the Q&A judge marks every answer consistent
    but the first; the other consistency measures mark every line consistent."""
    system = str(body["messages"][0]["content"])
    last = str(body["messages"][-1]["content"])
    if last.startswith(PREAMBLE):
        return "ANSWER to " + last.split(": ", 1)[1]
    user = str(body["messages"][-1]["content"])
    if "asked questions about itself" in system:
        n = len(re.findall(r"^\[\d+\] ANSWER:", user, flags=re.M))
        return json.dumps({"labels": [0] + [1] * (n - 1)})
    if "CLIENT" in system and "labels" in system:
        n = len(re.findall(r"^\[\d+\] CLIENT:", user, flags=re.M))
        return json.dumps({"labels": [1] * (n - 1 if "against itself" in system else n)})
    return default_reply(body)


def _config(base_url: str, **harness: Any) -> dict[str, Any]:
    return endpoint_config(
        base_url, personas={"n": 2}, dialogue={"max_turns_per_agent": 2, "max_tokens": 40},
        termination={"rules": False}, harness=harness,
    )


def _run(config: dict[str, Any], run: Path) -> None:
    summary = anyio.run(Engine(config_from(config), run, progress=False, sleep_scale=0.0).run)
    assert summary.completed == summary.planned == 2, summary.line()


@pytest.mark.e2e
def test_the_client_is_asked_about_itself_and_q_and_a_is_judged(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with TestServer(reply=_answer) as srv:
        _run(_config(srv.base_url, persona_probes=True), run)
        asked = [str(b["messages"][-1]["content"]) for b in srv.requests
                 if str(b["messages"][-1]["content"]).startswith(PREAMBLE)]
        m = evaluate(run, embedder="lookup", progress=False, consistency=True)

    personas = {(p := persona_of(r)).id: p
                for r in pd.read_parquet(run / "personas.parquet").to_dict("records")}
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    turns = pd.read_parquet(run / "turns.parquet").sort_values(["dialogue_id", "turn_index"])
    questions = []
    for d in dialogues.itertuples():
        persona = personas[str(d.persona_id)]
        expected = persona_questions(persona)
        assert [f for f, _, _ in expected] == ["age", "occupation", "city", "concern"]
        mine = turns[turns.dialogue_id == d.dialogue_id]
        client = mine[mine.speaker == "client"]
        # Only the Client's last turn holds the probes; no recall probes were asked.
        assert mine.probe.notna().sum() == 1 and client.probe.iloc[-1] is not None
        cell = client.probe.iloc[-1]
        assert load_probes(cell) == []
        stored = load_persona_probes(cell)
        assert [(p.field, p.question, p.expected) for p in stored] == expected
        assert [p.answer for p in stored] == [f"ANSWER to {q}" for _, q, _ in expected]
        assert stored[1].expected == persona.fields["occupation"]
        assert stored[0].expected == str(persona.fields["age"])
        questions += [q for _, q, _ in expected]
    # The server saw exactly these questions, each once, as persona_probe calls.
    assert sorted(q.split(": ", 1)[1] for q in asked) == sorted(questions)
    calls = pd.read_parquet(run / "calls.parquet")
    probes = calls[calls.role == "persona_probe"]
    assert len(probes) == len(questions) == 8 and set(probes.backend) == {"srv"}
    assert set(json.loads(p)["temperature"] for p in probes.params) == {0.0}

    # Q&A consistency: 3 of 4 answers consistent in every dialogue, one call per dialogue.
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet")
    assert per["qa_consistency"].tolist() == pytest.approx([0.75, 0.75])
    assert m.consistency is not None and m.consistency.fallbacks == 0
    assert not any("Q&A" in n for n in m.consistency.notes)
    [qa] = [s for s in m.consistency.stats if s.measure == "qa" and s.pairing == "all"]
    assert qa.n == 2 and qa.mean == pytest.approx(0.75)
    assert qa.ci_low is not None and qa.ci_high is not None
    saved = json.loads((run / "eval" / "metrics.json").read_text())
    assert any(s["measure"] == "qa" for s in saved["consistency"]["stats"])
    judged = pd.read_parquet(run / "calls.parquet")
    # prompt-to-line, line-to-line and Q&A: one call each per dialogue, logged with the run's calls
    assert (judged.role == "eval_consistency").sum() == 3 * 2 and judged.call_id.is_unique


@pytest.mark.e2e
def test_the_default_run_asks_nothing_and_keeps_its_fingerprint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with TestServer(reply=_answer) as srv:
        data = _config(srv.base_url)
        _run(data, run)
        assert not any(str(b["messages"][-1]["content"]).startswith(PREAMBLE) for b in srv.requests)
        m = evaluate(run, embedder="lookup", progress=False, consistency=True)
    turns = pd.read_parquet(run / "turns.parquet")
    assert turns.probe.isna().all()
    assert "persona_probe" not in set(pd.read_parquet(run / "calls.parquet").role)
    off = config_from(data)
    assert not off.harness.active
    assert config_from({**data, "harness": {"persona_probes": False}}).fingerprint() == off.fingerprint()
    on = config_from({**data, "harness": {"persona_probes": True}})
    assert on.harness.active and on.fingerprint() != off.fingerprint()
    # Without probe answers there is no Q&A score, and the metrics say how to get one.
    assert "qa_consistency" not in pd.read_parquet(run / "eval" / "per_dialogue.parquet")
    assert m.consistency is not None
    assert any("run with harness.persona_probes" in n for n in m.consistency.notes)
    assert all(s.measure != "qa" for s in m.consistency.stats)


def test_the_probe_cell_keeps_its_bytes_without_persona_probes() -> None:
    recall = [{"depth": 0.0, "index": 1, "partner_message": 1, "distance": 2, "in_window": True,
               "facts": ["washer"], "answer": "the washer", "recall": 1.0}]
    plain = dump_probes(recall)
    assert plain == json.dumps({"probes": recall}, ensure_ascii=False)
    assert load_persona_probes(plain) == [] and load_persona_probes(None) == []
    asked = [PersonaProbe(field="age", question="How old are you?", expected="34", answer="34.")]
    both = dump_probes(recall, asked)
    assert json.loads(both)["persona"] == [
        {"field": "age", "question": "How old are you?", "expected": "34", "answer": "34."}
    ]
    assert load_probes(both) == load_probes(plain) and load_persona_probes(both) == asked
    assert persona_questions(make_persona(age=40, location="Oslo", concern=" ")) == [
        ("age", "How old are you?", "40"), ("location", "Which city do you live in?", "Oslo")
    ]

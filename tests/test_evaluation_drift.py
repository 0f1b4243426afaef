"""Drift on constructed data where the answer is known, in cheap and probe mode."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from spasm.config import BackendConfig
from spasm.dataset.synthetic import write_run
from spasm.evaluation import Metrics, evaluate, register_embedder
from spasm.evaluation.drift import (
    dialogue_means,
    drift_from_anchor,
    paired_comparisons,
    persona_anchor_texts,
)
from spasm.evaluation.loader import Conversation
from spasm.evaluation.testing import LookupEmbedder
from spasm.testing import FaultPlan, TestServer

register_embedder("lookup", LookupEmbedder)

DIM = 16
E = np.eye(DIM, dtype=np.float32)

PERSONA = {
    "persona_id": "p1",
    "name": "Ana",
    "age": 40,
    "concern": "CONCERN",
    "emotion": "anxious",
    "intensity": "moderate",
    "motivation": "MOTIVE",
    "card": "CARD",
}


def _curve(metrics: Metrics, dim: str, condition: str = "ecp") -> list[float | None]:
    points = [p for p in metrics.drift.curves if p.dimension == dim and p.condition == condition]
    return [p.mean for p in sorted(points, key=lambda p: p.turn)]


def test_drift_formula() -> None:
    u = np.array([1.0, 0.0, 0.0])
    rows = np.array([[1.0, 0, 0], [0, 1.0, 0], [-1.0, 0, 0], [3.0, 0, 0], [1.0, 1.0, 0]])
    d = drift_from_anchor(u, rows)
    np.testing.assert_allclose(d[:4], [0.0, 1.0, 2.0, 0.0], atol=1e-12)
    v = rows[4] / np.linalg.norm(rows[4])
    assert d[4] == pytest.approx(0.5 * np.sum((u - v) ** 2))  # ½‖û − v̂‖²


def test_identical_utterances_give_zero_drift(tmp_path: Path) -> None:
    texts = [
        "I am worried about my pension.",
        "OK.",
        "I am worried about my pension.",
        "OK.",
        "I am worried about my pension.",
    ]
    write_run(tmp_path, [PERSONA], [{"dialogue_id": "d1", "persona_id": "p1", "texts": texts}])
    m = evaluate(tmp_path, embedder="lookup", write=False, progress=False)
    assert _curve(m, "utterance") == [0.0, 0.0, 0.0]


def test_identical_utterances_give_zero_drift_with_the_real_model(tmp_path: Path) -> None:
    texts = [
        "My washing machine broke and I want it fixed.",
        "Sorry to hear that.",
        "My washing machine broke and I want it fixed.",
        "I see.",
        "My washing machine broke and I want it fixed.",
    ]
    write_run(tmp_path, [PERSONA], [{"dialogue_id": "d1", "persona_id": "p1", "texts": texts}])
    m = evaluate(tmp_path, embedder="local", write=False, progress=False)
    assert _curve(m, "utterance") == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)


def test_orthogonal_embeddings_give_drift_one(tmp_path: Path) -> None:
    table = {
        "c0": E[0],
        "c1": E[1],
        "c2": E[2],
        "CONCERN": E[1],
        "MOTIVE": E[5],
        "I feel anxious (moderate).": E[0],
    }
    write_run(
        tmp_path,
        [PERSONA],
        [{"dialogue_id": "d1", "persona_id": "p1", "texts": ["c0", "r0", "c1", "r1", "c2"]}],
    )
    m = evaluate(
        tmp_path,
        embedder="lookup",
        embedder_options={"table": table, "dim": DIM},
        write=False,
        progress=False,
    )
    assert _curve(m, "utterance") == pytest.approx([0.0, 1.0, 1.0])
    # Persona-anchored dimensions: concern == c1, emotion == c0, motivation orthogonal to all.
    assert _curve(m, "concerns") == pytest.approx([1.0, 0.0, 1.0])
    assert _curve(m, "emotion") == pytest.approx([0.0, 1.0, 1.0])
    assert _curve(m, "motivation") == pytest.approx([1.0, 1.0, 1.0])
    assert m.drift.notes and "both conditions" in m.drift.notes[0]
    assert m.drift.comparisons == []


def test_persona_anchor_texts() -> None:
    assert persona_anchor_texts(PERSONA) == {
        "concerns": "CONCERN",
        "emotion": "I feel anxious (moderate).",
        "motivation": "MOTIVE",
    }
    assert persona_anchor_texts({"concerns": ["a", "b"], "emotion": "sad"}) == {
        "concerns": "a; b",
        "emotion": "I feel sad.",
        "motivation": None,
    }


def _conv(did: str, pid: str, condition: str, pairing: str = "a/b") -> Conversation:
    return Conversation(did, pid, 0, condition, pairing, "", ("client",), ("x",))


def test_paired_comparison_recovers_a_known_shift() -> None:
    rng = np.random.default_rng(0)
    convs, series = [], {}
    for i in range(30):
        for cond, level in (("ecp", 0.2), ("concat", 0.5)):
            did = f"{cond}-{i}"
            convs.append(_conv(did, f"p{i}", cond))
            series[did] = {"utterance": np.array([0.0, level + rng.normal(0, 0.05), level])}
    means = dialogue_means(series)
    (all_,) = paired_comparisons(means, convs)
    assert all_.pairing == "all" and all_.n_pairs == 30
    assert all_.delta == pytest.approx(-0.3, abs=0.03)
    assert all_.cohen_d is not None and all_.cohen_d < -2
    assert all_.p_ttest is not None and all_.p_ttest < 1e-6
    assert all_.p_wilcoxon is not None and all_.p_wilcoxon < 1e-4


def test_pairs_need_both_conditions_and_equal_keys() -> None:
    convs = [
        _conv("e1", "p1", "ecp"),
        _conv("c1", "p1", "concat"),
        _conv("e2", "p2", "ecp"),
        _conv("c3", "p3", "concat", pairing="x/y"),
    ]
    series = {
        c.dialogue_id: {"utterance": np.array([0.0, 0.1 if c.condition == "ecp" else 0.3])} for c in convs
    }
    comps = paired_comparisons(dialogue_means(series), convs)
    overall = next(c for c in comps if c.pairing == "all")
    assert overall.n_pairs == 1 and overall.delta == pytest.approx(-0.2)
    assert overall.p_ttest is None and overall.note  # one pair: no test, but a reason


def _probe_run(tmp_path: Path) -> Path:
    texts = ["c0", "r0", "c1", "r1", "c2"]
    return write_run(tmp_path, [PERSONA], [{"dialogue_id": "d1", "persona_id": "p1", "texts": texts}])


def _endpoint(server: TestServer) -> BackendConfig:
    # One attempt per call: a failed call falls back at once instead of after the backoff.
    return BackendConfig(kind="openai", base_url=server.base_url, model="probe-m", max_attempts=1)


def _last_client_turn(body: dict[str, Any]) -> str:
    first_ask = body["messages"][1]["content"]  # the conversation, also in a re-ask
    return str(first_ask.rsplit("Client: ", 1)[1].split()[0])  # "c0" | "c1" | "c2"


def test_probe_mode_uses_the_llm_stances(tmp_path: Path) -> None:
    run = _probe_run(tmp_path)

    def reply(body: dict[str, Any]) -> str:
        last = _last_client_turn(body)
        return json.dumps(
            {
                "concerns": "SAME CONCERN",
                "emotion": "EMO-A" if last == "c0" else "EMO-B",
                "motivation": f"MOT-{last}",
            }
        )

    table = {
        "SAME CONCERN": E[3],
        "EMO-A": E[4],
        "EMO-B": E[5],
        "MOT-c0": E[6],
        "MOT-c1": E[6],
        "MOT-c2": -E[6],
    }
    with TestServer(reply=reply) as srv:
        m = evaluate(
            run,
            embedder="lookup",
            embedder_options={"table": table, "dim": DIM},
            mode="probe",
            llm_config=_endpoint(srv),
            write=False,
            progress=False,
        )
        bodies = srv.requests
    assert {b["temperature"] for b in bodies} == {0.3} and {b["model"] for b in bodies} == {"probe-m"}
    assert all(b["response_format"]["type"] == "json_schema" for b in bodies)
    assert m.drift.probe_calls == 3 and m.drift.probe_fallbacks == 0
    assert _curve(m, "concerns") == pytest.approx([0.0, 0.0, 0.0])
    assert _curve(m, "emotion") == pytest.approx([0.0, 1.0, 1.0])
    assert _curve(m, "motivation") == pytest.approx([0.0, 0.0, 2.0])
    calls = pd.read_parquet(run / "calls.parquet")
    assert list(calls.role) == ["eval_probe"] * 3 and set(calls.dialogue_id) == {"d1"}


def test_probe_reasks_once_then_falls_back_to_the_utterance(tmp_path: Path) -> None:
    replies: list[str] = []

    def flaky(body: dict[str, Any]) -> str:
        # The re-ask carries the validation error; answer properly the second time.
        if "did not validate" in body["messages"][-1]["content"]:
            replies.append("fixed")
            return '```json\n{"concerns": "x", "emotion": "y", "motivation": "z"}\n```'
        replies.append("broken")
        return "Sure! concerns: x"

    with TestServer(reply=flaky) as srv:
        m = evaluate(
            _probe_run(tmp_path / "a"), embedder="lookup", mode="probe", llm_config=_endpoint(srv),
            write=False, progress=False,
        )
    assert m.drift.probe_calls == 6 and m.drift.probe_fallbacks == 0
    assert replies.count("fixed") == 3

    table = {"c0": E[0], "c1": E[0], "c2": E[1]}
    with TestServer(reply=lambda body: '{"concerns": ""}') as srv:
        m = evaluate(
            _probe_run(tmp_path / "b"),
            embedder="lookup",
            embedder_options={"table": table, "dim": DIM},
            mode="probe",
            llm_config=_endpoint(srv),
            write=False,
            progress=False,
        )
    assert m.drift.probe_calls == 6 and m.drift.probe_fallbacks == 3
    # Fallback: each stance is the utterance itself, so every dimension follows it.
    for dim in ("concerns", "emotion", "motivation", "utterance"):
        assert _curve(m, dim) == pytest.approx([0.0, 0.0, 1.0])
    assert any("Every probe fell back" in n for n in m.drift.notes)

    with TestServer(FaultPlan(rate_500=1.0)) as srv:  # every call fails: every turn falls back
        m = evaluate(
            _probe_run(tmp_path / "c"),
            embedder="lookup",
            embedder_options={"table": table, "dim": DIM},
            mode="probe",
            llm_config=_endpoint(srv),
            write=False,
            progress=False,
        )
    assert m.drift.probe_calls == 3 and m.drift.probe_fallbacks == 3
    assert m.llm is not None and m.llm.outcomes == {"server_error": 3}
    assert _curve(m, "emotion") == pytest.approx([0.0, 0.0, 1.0])


def test_one_turn_dialogues_have_no_mean() -> None:
    means = dialogue_means({"d": {"utterance": np.array([0.0])}})
    assert math.isnan(means["d"]["utterance"])

"""Persona consistency and judge ensembles: two judges that disagree on a known set, their
Fleiss' κ and disagreements, the one-family warning, cached and logged calls, read back."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from spasm.cli import main
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.echoing import EchoVerdict
from spasm.evaluation.ensemble import agreement, family_warning, majority_echoing, model_family
from spasm.evaluation.testing import LookupEmbedder
from spasm.testing import TestServer
from spasm.testing.server import default_reply
from tests.conftest import endpoint_config
from tests.eval_cli import eval_cli

register_embedder("lookup", LookupEmbedder)


def test_model_families_from_model_names() -> None:
    assert model_family("gpt-4o-mini") == "openai"
    assert model_family("deepseek-chat") == "deepseek"
    assert model_family("Qwen/Qwen2.5-7B-Instruct") == "qwen"
    assert model_family("claude-3-5-sonnet-latest") == "anthropic"
    assert model_family("meta-llama/Llama-3.1-8B-Instruct") == "meta"
    assert model_family("smollm2-135m", "embedded") == "smollm"
    assert model_family("foo-7b") == "foo"
    assert family_warning({"a": "openai", "b": "deepseek"}) is None
    warning = family_warning({"a": "openai", "b": "openai"})
    assert warning is not None and "one model family (openai)" in warning


def test_fleiss_kappa_of_two_judges_on_a_known_set() -> None:
    a = {"d1": "echoing", "d2": "echoing", "d3": "no", "d4": "no"}
    b = {"d1": "echoing", "d2": "no", "d3": "no", "d4": "no"}
    agreed, differ = agreement("echoing", {"a": a, "b": b})
    # Items agree 1, 0, 1, 1 -> P = 3/4; categories 3/8 and 5/8 -> Pe = 34/64; kappa = 7/15.
    assert agreed.kappa == pytest.approx(7 / 15)
    assert agreed.n_items == 4 and agreed.n_disagreements == 1 and agreed.agreement == 0.75
    assert [(d.item, d.labels) for d in differ] == [("d2", {"a": "echoing", "b": "no"})]


def _verdict(did: str, echoing: bool, method: str = "judge") -> EchoVerdict:
    return EchoVerdict(did, echoing, "client" if echoing else "none", float(echoing), 0, 0, [], method)  # type: ignore[arg-type]


def test_majority_of_judges_and_a_tie_keeps_the_rule() -> None:
    rule = {"d1": _verdict("d1", False, "rule"), "d2": _verdict("d2", True, "rule")}
    three = {
        "a": {"d1": _verdict("d1", True), "d2": _verdict("d2", False)},
        "b": {"d1": _verdict("d1", True), "d2": _verdict("d2", False)},
        "c": {"d1": _verdict("d1", False), "d2": _verdict("d2", False)},
    }
    out = majority_echoing(rule, three)
    assert out["d1"].echoing and out["d1"].who == "client" and not out["d2"].echoing
    two = {"a": three["a"], "c": three["c"]}
    assert majority_echoing(rule, two)["d1"] is rule["d1"]  # 1 vs 1: the rule decides


# ------------------------------------------------------------------ end to end, two judges

MODELS = ("gpt-4o-mini", "deepseek-chat", "gpt-4.1-nano")


def _reply(body: dict[str, Any]) -> str:
    """The gpt judge: every dialogue echoes, every line is consistent; the deepseek judge: no
    echoing, and it marks each dialogue's first line inconsistent."""
    system = str(body["messages"][0]["content"])
    user = str(body["messages"][-1]["content"])
    gpt = str(body["model"]).startswith("gpt")
    if "ECHOING" in system:
        if gpt:
            return json.dumps({"echoing": True, "who": "client", "evidence": []})
        return json.dumps({"echoing": False, "who": "none", "evidence": []})
    if "CLIENT" in system and "labels" in system:
        n = len(re.findall(r"^\[\d+\] CLIENT:", user, flags=re.M))
        if "against itself" in system:
            n -= 1
        labels = [1] * n if gpt else [0] + [1] * (n - 1)
        return json.dumps({"labels": labels})
    return default_reply(body)


def _generate(tmp_path: Path, base_url: str) -> Path:
    backends = {
        "gpt": {"kind": "openai", "base_url": base_url, "model": MODELS[0], "api_key_env": None},
        "ds": {"kind": "openai", "base_url": base_url, "model": MODELS[1], "api_key_env": None},
        "nano": {"kind": "openai", "base_url": base_url, "model": MODELS[2], "api_key_env": None},
    }
    data = endpoint_config(
        base_url,
        personas={"n": 2},
        dialogue={"max_turns_per_agent": 2},
        backends=backends,
        pairings=[{"client": "gpt", "responder": "gpt"}],
    )
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(data))
    run = tmp_path / "run"
    assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 0
    return run


@pytest.mark.e2e
def test_two_judges_of_two_families_report_results_agreement_and_disagreements(tmp_path: Path) -> None:
    with TestServer(reply=_reply, models=MODELS) as srv:
        run = _generate(tmp_path, srv.base_url)
        n_dialogues = len(pd.read_parquet(run / "dialogues.parquet"))
        options: dict[str, Any] = {"judges": ["gpt", "ds"], "consistency": True, "judge": True}
        m = evaluate(run, embedder="lookup", progress=False, **options)
        sent = len(srv.requests)
        again = evaluate(run, embedder="lookup", progress=False, **options)
        assert len(srv.requests) == sent  # the second evaluation is answered from the cache

    e = m.judges
    assert e is not None and e.judges == ["gpt", "ds"]
    assert e.families == {"gpt": "openai", "ds": "deepseek"} and e.warnings == []
    results = {(r.judge, r.metric): r for r in e.results}
    assert results[("gpt", "echoing")].value == 1.0 and results[("ds", "echoing")].value == 0.0
    assert results[("gpt", "consistency_prompt_to_line")].value == 1.0
    agreed = {a.metric: a for a in e.agreement}
    # Every dialogue judged both ways: each item splits 1/1, so kappa = (0 - 1/2) / (1 - 1/2).
    assert agreed["echoing"].n_items == n_dialogues and agreed["echoing"].kappa == pytest.approx(-1.0)
    assert agreed["echoing"].n_disagreements == n_dialogues
    # Consistency: the judges differ only on line 0 (prompt-to-line) / line 1 (line-to-line).
    p2l = [d for d in e.disagreements if d.metric == "consistency_prompt_to_line"]
    assert len(p2l) == n_dialogues and all(d.item.endswith("#0") for d in p2l)
    assert all(d.labels == {"gpt": "1", "ds": "0"} for d in p2l)
    l2l = [d for d in e.disagreements if d.metric == "consistency_line_to_line"]
    assert all(d.item.endswith("#1") for d in l2l)
    # A tie between two judges keeps the rule's echoing verdict.
    assert m.echoing.judge_calls == 2 * n_dialogues

    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet")
    client_lines = per["n_client_turns"]
    expected = (2 * client_lines - 1) / (2 * client_lines)  # one 0 among both judges' labels
    assert per["consistency_prompt_to_line"].tolist() == pytest.approx(expected.tolist())
    assert m.consistency is not None and m.consistency.fallbacks == 0
    assert any("Q&A" in n for n in m.consistency.notes)
    html = (run / "eval" / "report.html").read_text()
    assert "Persona consistency" in html and "Fleiss" in html

    calls = pd.read_parquet(run / "calls.parquet")
    cons = calls[calls.role == "eval_consistency"]
    assert set(cons.backend) == {"gpt", "ds"} and len(cons) >= 2 * n_dialogues
    assert calls.call_id.is_unique
    saved = json.loads((run / "eval" / "metrics.json").read_text())
    assert saved["judges"]["agreement"][0]["statistic"] == "fleiss"
    assert again.judges is not None and again.judges.agreement == e.agreement
    compare = json.loads((run / "eval" / "compare.json").read_text())
    assert "consistency_prompt_to_line" in compare["metrics"]


@pytest.mark.e2e
def test_judges_of_one_family_are_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with TestServer(reply=_reply, models=MODELS) as srv:
        run = _generate(tmp_path, srv.base_url)
        argv = ["eval", str(run), "--embedder", "lookup", "--no-progress"]
        assert eval_cli([*argv, "--judge-backend", "gpt", "--judge-backend", "nano"]) == 0
    captured = capsys.readouterr()
    assert "one model family (openai)" in captured.err
    assert "Judges on echoing: Fleiss' kappa" in captured.out
    saved = json.loads((run / "eval" / "metrics.json").read_text())
    assert saved["judge"] is True and saved["judges"]["families"] == {"gpt": "openai", "nano": "openai"}
    assert "one model family" in saved["judges"]["warnings"][0]

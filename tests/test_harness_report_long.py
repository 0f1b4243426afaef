"""The long ablation: 100-utterance dialogues at levels A–E through the real engine, and the
level report's metrics with intervals, recall by probe depth and the cache-adjusted cost."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest
import yaml

from spasm.config import parse_config
from spasm.dataset.columns import Probe, load_probes
from spasm.engine import Engine
from spasm.errors import UserError
from spasm.harness.level_metrics import DEFINITIONS, MEASUREMENT_ROLES, ONE_OFF_ROLES, adjusted_tokens
from spasm.harness.level_report import level_report
from spasm.harness.probe import PROBE_QUESTION, probe_question, probe_targets
from spasm.projection import Viewer
from spasm.testing import TestServer
from spasm.testing.checker_profile import CheckerProfile
from spasm.testing.usage import Usage

pytestmark = pytest.mark.e2e

LONG = Path(__file__).parent.parent / "configs" / "harness-long.yaml"
PRICES = {"input_per_1m": 2.0, "output_per_1m": 8.0, "cached_input_per_1m": 0.5}
_NTH = re.compile(r"message number (\d+) of the (\d+) they have sent so far "
                  r"\((?:(\d+) before their latest|their latest)\)")
_CUE = Viewer("client", "").opening
_RATES = {"boundary_violation_rate", "decision_consistency", "state_jump_rate", "state_clip_rate",
          "state_step_violation_rate", "style_similarity", "style_consistency", "recall",
          "recall_out_of_window", "fallback_turn_share"}


class PromptReader:
    """A ``reply`` for the test server: the checker profile, except that a probe is answered by
    reading the prompt — the partner's messages are its ``user`` messages (the opening cue left
    out), counted from the end as the question says. So an answer is right exactly when the
    question names the message and the message is still in the prompt."""

    def __init__(self) -> None:
        self.profile = CheckerProfile(0.85, 0.12, seed=5)

    def __call__(self, body: dict[str, Any]) -> str:
        messages = body.get("messages") or []
        question = str(messages[-1].get("content")) if messages else ""
        if not question.startswith("Pause the conversation"):
            return self.profile(body)
        theirs = [str(m["content"]) for m in messages if m["role"] == "user" and m["content"] != _CUE]
        if question == PROBE_QUESTION:
            return theirs[0] if theirs else "I do not remember."
        match = _NTH.search(question)
        assert match, question
        back = int(match.group(3) or 0)
        return theirs[-1 - back] if back < len(theirs) else "I do not remember."


def _long_config(base_url: str) -> Any:
    """configs/harness-long.yaml on the test server: 2 personas, no engine cache."""
    data = yaml.safe_load(LONG.read_text(encoding="utf-8"))
    data["personas"]["n"] = 2
    data["backends"] = {"srv": {"kind": "openai", "base_url": base_url, "model": "m",
                                "max_concurrency": 16, "prices": PRICES}}
    data["pairings"] = [{"client": "srv", "responder": "srv"}]
    data["engine"] = {"cache": False}
    return parse_config(data, "harness-long.yaml on the test server")


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run = tmp_path_factory.mktemp("long") / "run"
    with TestServer(reply=PromptReader(), usage=Usage(prefix_cache=True)) as srv:
        summary = anyio.run(Engine(_long_config(srv.base_url), run, progress=False,
                                   sleep_scale=0.0).run)
    assert summary.completed == summary.planned == 10, summary.line()
    return run, level_report(run)


def test_the_long_config_runs_100_utterances_at_all_five_levels_with_probes_at_depths() -> None:
    config = _long_config("http://127.0.0.1:1/v1")
    assert config.harness.levels == ["A", "B", "C", "D", "E"]
    assert config.dialogue.max_turns_per_agent * 2 == 100 and not config.termination.rules
    assert config.harness.recall_probe and config.harness.audit
    assert config.harness.probe_depths == [0, 0.25, 0.5, 0.75]


def test_every_level_has_every_metric_with_an_interval(long_run: tuple[Path, dict[str, Any]]) -> None:
    run, report = long_run
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    assert (dialogues.n_utterances == 100).all()
    assert set(report["levels"]) == {"A", "B", "C", "D", "E"}
    for name, level in report["levels"].items():
        metrics = level["metrics"]
        assert set(metrics) == set(DEFINITIONS), name
        for key, e in metrics.items():
            # No state below C and nothing out of A's window: n/a, not 0.
            missing = (name in ("A", "B") and key.startswith("state_")) or (
                name == "A" and key == "recall_out_of_window")
            assert (e is None) == missing, (name, key)
            if e is None:
                continue
            lo, hi = e["ci95"]
            assert lo <= e["value"] <= hi and e["n"] >= 1, (name, key, e)
            if key in _RATES:
                assert lo >= 0 and hi <= 1, (name, key, e)
            else:
                assert lo >= 0, (name, key, e)
        assert metrics["tokens_per_dialogue"]["n"] == 2
        # The constraints hold end to end: no stored state moved more than the per-turn limit.
        if name in ("C", "D", "E"):
            assert metrics["state_step_violation_rate"]["value"] == 0
    e = report["levels"]["E"]["metrics"]
    assert e["fallback_turn_share"]["value"] == 0  # every scripted structured reply parses
    md = (run / "harness_report.md").read_text(encoding="utf-8")
    assert "| state: turns with a jump | n/a | n/a |" in md
    assert "turns with a fallback" in md and "95% interval" in md


def test_recall_is_reported_by_depth_and_falls_once_the_message_leaves_the_window(
    long_run: tuple[Path, dict[str, Any]],
) -> None:
    run, report = long_run
    turns = pd.read_parquet(run / "turns.parquet")
    stored = [json.loads(raw) for raw in turns.probe.dropna()]
    assert len(stored) == 20  # each speaker's last turn of 10 dialogues
    for s in stored:
        assert [p["depth"] for p in s["probes"]] == [0, 0.25, 0.5, 0.75]
        for p in s["probes"]:
            assert {"index", "distance", "in_window", "facts", "answer", "recall"} <= set(p)
            assert p["distance"] == 99 - p["index"]
    for name, level in report["levels"].items():
        by_depth = level["recall_by_depth"]
        assert list(by_depth) == ["0", "0.25", "0.5", "0.75"]
        assert by_depth["0"]["mean_distance"] > by_depth["0.75"]["mean_distance"] > 20
        assert all(d["probes"] == 4 for d in by_depth.values())
        window = [d["in_window_share"] for d in by_depth.values()]
        assert window == ([1.0] * 4 if name == "A" else [0.0] * 4), name
    # Level A keeps every message in its prompt, and the question names the right one.
    a = report["levels"]["A"]
    assert all(d["recall"]["value"] == 1.0 for d in a["recall_by_depth"].values())
    assert a["metrics"]["recall_out_of_window"] is None
    for name in ("B", "C", "D", "E"):
        assert report["levels"][name]["metrics"]["recall_out_of_window"]["value"] < 0.5, name


def test_cache_adjusted_cost_uses_the_api_cached_tokens_at_the_backends_price(
    long_run: tuple[Path, dict[str, Any]],
) -> None:
    run, report = long_run
    assert report["cost_source"] == "api"
    calls = pd.read_parquet(run / "calls.parquet")
    level = pd.read_parquet(run / "dialogues.parquet").set_index("dialogue_id").harness_level
    cost = calls[~calls.role.isin(MEASUREMENT_ROLES | ONE_OFF_ROLES)]
    cost = cost.assign(level=cost.dialogue_id.map(level))
    assert cost.cached_tokens.sum() > 0
    relative = PRICES["cached_input_per_1m"] / PRICES["input_per_1m"]
    for name, g in cost.groupby("level"):
        raw = float((g.prompt_tokens + g.completion_tokens).sum()) / 2
        adjusted = raw - (1 - relative) * float(g.cached_tokens.sum()) / 2
        m = report["levels"][name]["metrics"]
        assert m["tokens_per_dialogue"]["value"] == pytest.approx(raw, abs=0.01)
        assert m["cache_adjusted_tokens_per_dialogue"]["value"] == pytest.approx(adjusted, abs=0.01)
        assert adjusted < raw
    assert report["token_ratio_vs_A"]["E"]["cache_adjusted_ratio"] is not None


def _calls(**cols: list[Any]) -> pd.DataFrame:
    base = {"dialogue_id": ["d1", "d1"], "backend": ["a", "b"], "prompt_tokens": [100, 100],
            "completion_tokens": [10, 10]}
    return pd.DataFrame({**base, **cols})


def test_the_cache_adjusted_price_follows_each_backends_prices_or_the_discount() -> None:
    turns = pd.DataFrame({"dialogue_id": ["d1"], "cached_prompt_tokens": [80]})
    backends = {"a": {"prices": {"input_per_1m": 1.0, "cached_input_per_1m": 0.1}},
                "b": {"prices": {"input_per_1m": 1.0, "cached_input_per_1m": None}}}
    adjusted, source = adjusted_tokens(_calls(cached_tokens=[50, 50]), turns, backends, 0.5)
    # a: 50 cached at a tenth; b sets an input price but no cached one: not discounted.
    assert source == "api" and adjusted["d1"] == pytest.approx(220 - 50 * 0.9)
    adjusted, _ = adjusted_tokens(_calls(cached_tokens=[50, 50]), turns, {}, 0.5)
    assert adjusted["d1"] == pytest.approx(220 - 100 * 0.5)  # no prices: the discount
    # No call reports cached tokens (or an older run without the column): the estimate.
    for calls in (_calls(cached_tokens=[0, 0]), _calls()):
        adjusted, source = adjusted_tokens(calls, turns, backends, 0.5)
        assert source == "estimate" and adjusted["d1"] == pytest.approx(220 - 0.5 * 80)


def test_probes_name_messages_by_place_and_old_single_probe_rows_still_read() -> None:
    speakers = ["client", "responder"] * 10
    targets = probe_targets(speakers, "responder", [0, 0.25, 0.5, 0.75])
    assert [(t.index, t.ordinal, t.of) for t in targets] == [(1, 1, 10), (5, 3, 10), (11, 6, 10),
                                                             (15, 8, 10)]
    assert probe_question(targets[0]) == PROBE_QUESTION
    assert "message number 8 of the 10" in probe_question(targets[3])
    assert "(2 before their latest)" in probe_question(targets[3])
    # A short dialogue: depths that land on the same message ask once.
    assert len(probe_targets(["client", "responder"], "responder", [0, 0.25, 0.5])) == 1
    assert probe_targets(["client"], "responder", [0]) == []
    old = json.dumps({"opening_index": 1, "in_window": False, "facts": ["washing"],
                      "answer": "washing", "recall": 1.0})
    [p] = load_probes(old, n_utterances=10)
    assert p.depth == 0 and p.index == 1 and p.distance == 8 and p.recall == 1.0
    new = [{"depth": 0.5, "index": 4, "recall": 0.5}]
    assert load_probes(json.dumps({"probes": new})) == load_probes(json.dumps(new)) == [
        Probe(depth=0.5, index=4, recall=0.5)]
    assert load_probes(None) == []


@pytest.mark.parametrize("depths", [[], [1.0], [-0.1], [0.5, 0.5]])
def test_probe_depths_are_distinct_fractions_below_one(depths: list[float]) -> None:
    data = yaml.safe_load(LONG.read_text(encoding="utf-8"))
    data["harness"]["probe_depths"] = depths
    with pytest.raises(UserError, match="probe_depths"):
        parse_config(data, "<test>")

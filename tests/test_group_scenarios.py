"""Scenarios in group dialogues: every group dialogue is
crossed with every scenario, the same people meet every scenario, every client seat's card
carries the situation and the goal, every responder seat's instructions the context, nobody
sees the expected outcome, and one goal-judge call over the whole group transcript (lines
labelled with participant ids) decides ``dialogues.goal_met``; on the test server, read back
from Parquet, sharded and merged, estimated, evaluated and compared."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest
import yaml

from spasm.config import parse_config
from spasm.dataset import open_run
from spasm.engine import Engine
from spasm.errors import ConfigError
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.compare import load_comparison
from spasm.evaluation.goals import goal_metrics
from spasm.evaluation.loader import load_run
from spasm.evaluation.testing import LookupEmbedder
from spasm.goals import goal_messages
from spasm.history import History
from spasm.personas.persona import Persona
from spasm.runner import GroupSpec
from spasm.runplan import Shard, group_dialogue_id, plan
from spasm.seeds import derive_seed
from spasm.testing import TestServer
from spasm.testing.replies import default_reply
from tests.conftest import endpoint_config, make_persona
from tests.test_shards import sorted_rows

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS: list[dict[str, Any]] = yaml.safe_load(
    (ROOT / "configs" / "examples" / "scenarios.yaml").read_text(encoding="utf-8"))["scenarios"]
IDS = ("Ana", "Ben", "Carla", "Facilitator")
CLIENTS = IDS[:3]
#: Only the group goal judge's instructions say this (the two-party judge's never do).
GROUP_JUDGE = "came for help and share one goal"

register_embedder("lookup", LookupEmbedder)


def _data(base_url: str, scenarios: Any = SCENARIOS[:2], **overrides: Any) -> dict[str, Any]:
    data = endpoint_config(
        base_url, **{"personas": {"n": 6}, "conditions": ["ecp", "concat"], **overrides},
        participants=[
            {"id": "Ana", "role": "client", "backend": "srv"},
            {"id": "Ben", "role": "client", "backend": "srv"},
            {"id": "Carla", "role": "client", "backend": "srv"},
            {"id": "Facilitator", "role": "responder", "backend": "srv",
             "responder_role": "customer-service agent"},
        ],
        group={"max_utterances": 8},
    )
    data.pop("pairings")
    if scenarios is not None:
        data["scenarios"] = scenarios
    return data


def _personas(n: int = 6) -> list[Persona]:
    return [make_persona(f"p{i}", i, f"card of p{i}") for i in range(n)]


class Judge:
    """A server reply: the goal judge says ``met`` and its requests are kept; everyone else
    answers as by default."""

    def __init__(self, met: bool = True) -> None:
        self.met = met
        self.requests: list[list[dict[str, Any]]] = []

    def __call__(self, body: dict[str, Any]) -> str:
        messages = body["messages"]
        if GROUP_JUDGE in str(messages[0].get("content", "")):
            self.requests.append(messages)
            return json.dumps({"goal_met": self.met,
                               "reason": "judged met" if self.met else "judged unmet"})
        return default_reply(body)


def _run(out: Path, data: dict[str, Any]) -> None:
    summary = anyio.run(Engine(parse_config(data, "<test>"), out, progress=False,
                               sleep_scale=0.0).run)
    assert summary.completed == summary.planned, summary.line()


# -- the plan ---------------------------------------------------------------------------------
def test_group_dialogues_cross_scenarios_with_the_same_people_and_paired_seeds() -> None:
    base = parse_config(_data("http://127.0.0.1:9/v1", scenarios=None), "<t>")
    cfg = parse_config(_data("http://127.0.0.1:9/v1", scenarios=SCENARIOS), "<t>")
    before = list(plan(base, _personas()))
    specs = list(plan(cfg, _personas()))
    # Without scenarios: the plain ids and seeds (g<index>-<condition>, the draw's seed).
    assert [s.dialogue_id for s in before] == ["g0000-ecp", "g0000-concat", "g0001-ecp",
                                               "g0001-concat"]
    assert [s.seed for s in before] == [derive_seed(7, "group", g) for g in (0, 0, 1, 1)]
    assert all(s.scenario is None for s in before)
    # With 3 scenarios: 2 groups × 3 scenarios × 2 conditions, the scenario after the index.
    assert len(specs) == 12 and all(isinstance(s, GroupSpec) for s in specs)
    assert specs[0].dialogue_id == "g0000-slate%2Dorder-ecp"
    assert group_dialogue_id(3, "ecp") == "g0003-ecp"
    assert group_dialogue_id(3, "my-cond", "a-b") == "g0003-sa%2Db-my%2Dcond"
    assert len({s.dialogue_id for s in specs}) == 12
    seats = {s.dialogue_id: [f.persona.id if f.persona else None
                             for f in s.seats] for s in before if isinstance(s, GroupSpec)}
    assert len(seats) == 4
    for s in specs:
        assert isinstance(s, GroupSpec) and s.scenario is not None
        assert s.dialogue_id == group_dialogue_id(s.conversation_index, s.condition, s.scenario.id)
        # The same people as the group's draw without scenarios, in every scenario.
        people = [f.persona.id if f.persona else None for f in s.seats]
        assert people == seats[f"g{s.conversation_index:04d}-{s.condition}"]
        assert s.seed == derive_seed(7, "group", s.conversation_index, s.scenario.id)
    # Conditions share a seed; scenarios of one group do not.
    by = pd.DataFrame([{"g": s.conversation_index, "scenario": s.scenario.id if s.scenario else "",
                        "condition": s.condition, "seed": s.seed} for s in specs])
    assert by.groupby(["g", "scenario"]).seed.nunique().eq(1).all()
    assert by.groupby(["g", "condition"]).seed.nunique().eq(3).all()
    # Shards: every scenario of group g in shard g % 2, and together the whole plan.
    parts = [list(plan(cfg, _personas(), Shard(i, 2))) for i in (0, 1)]
    assert [s.dialogue_id for s in parts[0]] == [s.dialogue_id for s in specs[:6]]
    assert {s.conversation_index for s in parts[1]} == {1} and len(parts[1]) == 6
    assert sorted(s.dialogue_id for p in parts for s in p) == sorted(s.dialogue_id for s in specs)


def test_a_persona_with_its_own_scenario_is_refused_in_a_group_run() -> None:
    """Personas from data may name their scenario (1:1 in a two-party run). A group run draws
    its seats from all personas and crosses every group with every scenario, so a persona's
    own scenario cannot be honoured: a ConfigError says so before any dialogue runs."""
    cfg = parse_config(_data("http://127.0.0.1:9/v1", scenarios=SCENARIOS), "<t>")
    personas = _personas()
    personas[4] = replace(personas[4], fields={"scenario": "cancel-plan"})
    with pytest.raises(ConfigError, match=r"persona 'p4' names its own scenario \('cancel-plan'\)"
                       r".*crosses every group dialogue with every scenario"):
        list(plan(cfg, personas))
    # An empty scenario column is no scenario; a run without scenarios ignores the field (as
    # two-party runs do).
    personas[4] = replace(personas[4], fields={"scenario": ""})
    assert len(list(plan(cfg, personas))) == 12
    personas[4] = replace(personas[4], fields={"scenario": "cancel-plan"})
    base = parse_config(_data("http://127.0.0.1:9/v1", scenarios=None), "<t>")
    assert [s.dialogue_id for s in plan(base, personas)][:1] == ["g0000-ecp"]


def test_the_two_party_goal_judge_reads_as_before_and_the_group_one_names_the_seats() -> None:
    h = History().append("client", "My kettle is late.").append("responder", "A refund, then.")
    two = goal_messages(h, "a refund", "the agent refunds")
    assert two[0]["content"].startswith("You read a conversation between a Client and a "
                                        "Responder and decide whether the Client's goal was met")
    assert two[1]["content"] == ("The Client's goal: a refund\nThe expected outcome: the agent "
                                 "refunds\n\nThe conversation:\nClient: My kettle is late.\n"
                                 "Responder: A refund, then.")
    g = History().append("Ana", "Late kettle.").append("client", "Me too.").append("Fac", "Refund.")
    group = goal_messages(g, "a refund", "the agent refunds",
                          [("Ana", "client"), ("client", "client"), ("Fac", "responder")])
    assert group[0]["content"].startswith(
        "You read a group conversation between Ana, client and Fac. Ana and client came for "
        "help and share one goal; Fac is there to help.")
    assert "counts only when Fac commits to it" in group[0]["content"]
    # Every line carries the participant id, even one that is spelled like a two-party role.
    assert group[1]["content"] == ("The goal of Ana and client: a refund\nThe expected outcome: "
                                   "the agent refunds\n\nThe conversation (each line begins with "
                                   "the speaker's id):\nAna: Late kettle.\nclient: Me too.\n"
                                   "Fac: Refund.")


# -- the run ----------------------------------------------------------------------------------
def test_every_seat_sees_its_part_of_the_scenario_and_the_judge_reads_the_group(
    tmp_path: Path,
) -> None:
    judge = Judge(met=True)
    out = tmp_path / "run"
    with TestServer(reply=judge) as srv:
        _run(out, _data(srv.base_url))
    dialogues = pd.read_parquet(out / "dialogues.parquet")
    seats = pd.read_parquet(out / "participants.parquet")
    assert len(dialogues) == 2 * 2 * 2  # groups × scenarios × conditions
    assert list(dialogues.columns[-3:]) == ["scenario_id", "goal_met", "goal_reason"]
    assert dialogues.goal_met.tolist() == [True] * 8 and set(dialogues.goal_reason) == {"judged met"}
    by_id = {s["id"]: s for s in SCENARIOS}
    assert set(dialogues.scenario_id) == {"late-order", "double-charge"}
    run = open_run(out)
    cards = run.personas.set_index("persona_id").card
    for row in dialogues.to_dict("records"):
        s = by_id[row["scenario_id"]]
        assert row["dialogue_id"] == group_dialogue_id(
            int(row["dialogue_id"][1:5]), row["condition"], row["scenario_id"])
        mine = seats[seats.dialogue_id == row["dialogue_id"]]
        assert list(mine.participant_id) == list(IDS)
        for seat in mine.to_dict("records"):
            frame = seat["system_prompt"]
            assert s["expected_outcome"] not in frame
            if seat["role"] == "client":
                assert s["situation"] in frame and s["goal"] in frame
                assert cards[seat["persona_id"]] in frame and s["context"] not in frame
            else:
                assert s["context"] in frame
                assert s["situation"] not in frame and s["goal"] not in frame
                assert not any(c in frame for c in cards)
        view = run.dialogue(row["dialogue_id"])
        for i in range(len(view.turns)):
            seen = view.seen(i)
            assert seen.verified is True
            assert json.dumps(s["expected_outcome"])[1:-1] not in json.dumps(seen.messages)
    # The same people meet both scenarios, in both conditions.
    people = seats[seats.role == "client"].copy()
    people["g"] = people.dialogue_id.str[:5]
    assert people.dialogue_id.nunique() == 8
    assert people.groupby(["g", "position"]).persona_id.nunique().eq(1).all()
    # One goal_judge call a dialogue, logged; its transcript labels each line with the id.
    calls = run.calls
    judged = calls[calls.role == "goal_judge"]
    assert len(judged) == 8 and set(judged.dialogue_id) == set(dialogues.dialogue_id)
    assert len(judge.requests) == 8
    turns = pd.read_parquet(out / "turns.parquet")
    texts = {(r.dialogue_id, r.turn_index): f"{r.speaker}: {r.text}" for r in turns.itertuples()}
    for messages in judge.requests:
        system, user = messages[0]["content"], messages[1]["content"]
        assert system.startswith("You read a group conversation between Ana, Ben, Carla and "
                                 "Facilitator. Ana, Ben and Carla came for help")
        lines = user.split("(each line begins with the speaker's id):\n", 1)[1].split("\n")
        assert {line.split(": ", 1)[0] for line in lines} == set(IDS)
        assert all(line in texts.values() for line in lines)
        assert any(s["expected_outcome"] in user for s in SCENARIOS)
    # Goal success by condition (Wilson) and paired by compare, as in two-party runs.
    goals = goal_metrics(load_run(out).conversations)
    assert goals is not None and goals.scenarios == 2
    rates = {(r.condition, r.scenario_id): r for r in goals.rates if r.pairing == "all"}
    assert (rates[("ecp", "all")].n, rates[("ecp", "all")].n_met) == (4, 4)
    assert rates[("concat", "late-order")].n == 2 and rates[("ecp", "all")].ci_low is not None


@pytest.mark.e2e
def test_group_goal_success_shows_in_spasm_eval_and_compare(tmp_path: Path) -> None:
    judge = Judge(met=False)
    out = tmp_path / "run"
    with TestServer(reply=judge) as srv:
        _run(out, _data(srv.base_url, scenarios=SCENARIOS[:1]))
    metrics = evaluate(out, embedder="lookup", progress=False)
    assert metrics.group is not None and metrics.goals is not None  # both, side by side
    per = pd.read_parquet(out / "eval" / "per_dialogue.parquet")
    assert set(per.scenario_id) == {"late-order"} and (per.goal_met == 0.0).all()
    assert per.persona_set.notna().all()
    stored = json.loads((out / "eval" / "metrics.json").read_text())["goals"]
    overall = {r["condition"]: r for r in stored["rates"]
               if r["pairing"] == "all" and r["scenario_id"] == "all"}
    assert {c: (r["n"], r["n_met"], r["rate"]) for c, r in overall.items()} == {
        "ecp": (2, 0, 0.0), "concat": (2, 0, 0.0)}
    assert 0 < overall["ecp"]["ci_high"] < 1  # a Wilson interval
    # compare pairs each group with its twin in the other condition (same people, scenario).
    comparison = load_comparison(out / "eval" / "compare.json")
    assert {"scenario_id", "persona_set"} <= set(comparison.pair_key)
    goal = next(x for x in comparison.contrasts if x.metric == "goal_met" and x.pairing == "all")
    assert (goal.baseline, goal.condition, goal.n_pairs, goal.delta) == ("ecp", "concat", 2, 0.0)


def test_the_goal_judge_ends_a_group_when_asked_after_a_helper_speaks(tmp_path: Path) -> None:
    data = _data("", scenarios=SCENARIOS[:1], scenarios_judge={"termination": True},
                 termination={"rules": False, "min_utterances": 2}, conditions=["ecp"])
    for met, reason in ((True, "goal_reached"), (False, "max_utterances")):
        judge = Judge(met=met)
        out = tmp_path / f"run-{met}"
        with TestServer(reply=judge) as srv:
            data["backends"]["srv"]["base_url"] = srv.base_url
            _run(out, data)
        d = pd.read_parquet(out / "dialogues.parquet")
        calls = pd.read_parquet(out / "calls.parquet")
        judged = (calls.role == "goal_judge").sum()
        assert set(d.termination_reason) == {reason} and d.goal_met.tolist() == [met, met]
        if met:  # the Facilitator's first turn (the 4th utterance) ends it; no second call
            assert d.n_utterances.tolist() == [4, 4] and judged == 2
            assert set(d.termination_detail) == {"judged met"}
        else:  # asked after each of the Facilitator's 2 turns in 8, then once after the end
            assert d.n_utterances.tolist() == [8, 8] and judged == 2 * (2 + 1)
    # Every call (each detector check and the final one) came after a Facilitator turn.
    assert len(judge.requests) == 6
    assert all(m[-1]["content"].split("\n")[-1].startswith("Facilitator: ")
               for m in judge.requests)


def test_the_dry_run_counts_one_goal_judge_call_per_group_dialogue(tmp_path: Path) -> None:
    cfg = parse_config(_data("http://127.0.0.1:9/v1"), "<t>")
    engine = Engine(cfg, tmp_path / "run", progress=False, sleep_scale=0.0)
    dry = anyio.run(lambda: engine.dry_run(0))
    assert dry.planned == 8 and dry.roles["goal_judge"] == 8
    assert not (tmp_path / "run").exists()
    without = parse_config(_data("http://127.0.0.1:9/v1", scenarios=None), "<t>")
    dry = anyio.run(Engine(without, tmp_path / "run", progress=False, sleep_scale=0.0).dry_run)
    assert dry.planned == 4 and "goal_judge" not in dry.roles


@pytest.mark.e2e
def test_group_shards_with_scenarios_merge_into_the_unsharded_run(tmp_path: Path) -> None:
    judge = Judge(met=True)
    with TestServer(reply=judge) as srv:
        data = _data(srv.base_url, conditions=["ecp"])
        data["personas"] = {"n": 9}  # 3 groups × 2 scenarios
        cfg = tmp_path / "group.json"
        cfg.write_text(json.dumps(data))
        for out, extra in [("full", []), ("s0", ["--shard", "0/2"]), ("s1", ["--shard", "1/2"])]:
            subprocess.run([sys.executable, "-m", "spasm", "generate", "--config", str(cfg),
                            "--out", str(tmp_path / out), "--no-progress", *extra],
                           check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "spasm", "merge", str(tmp_path / "s0"),
                    str(tmp_path / "s1"), "--out", str(tmp_path / "merged")],
                   check=True, capture_output=True)
    s1 = pd.read_parquet(tmp_path / "s1" / "dialogues.parquet")
    assert sorted(s1.dialogue_id) == ["g0001-sdouble%2Dcharge-ecp", "g0001-slate%2Dorder-ecp"]
    for table in ("dialogues", "participants", "turns", "personas"):
        pd.testing.assert_frame_equal(sorted_rows(tmp_path / "full", table),
                                      sorted_rows(tmp_path / "merged", table))
    merged = pd.read_parquet(tmp_path / "merged" / "dialogues.parquet")
    assert len(merged) == 6 and merged.goal_met.all()
    calls = pd.read_parquet(tmp_path / "merged" / "calls.parquet")
    assert (calls.role == "goal_judge").sum() == 6

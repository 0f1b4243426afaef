"""Scenarios with goals, end to end on the test server.

The Client's card carries the situation and the goal, never the expected outcome; the
Responder sees only its role and the scenario's context; the goal judge decides after the
dialogue (and, when asked, ends it once the goal is reached); ``dialogues.scenario_id``,
``goal_met`` and ``goal_reason`` are read back from Parquet; runs without scenarios keep their
columns and ids; bad scenario files are a clear error naming the file and the line.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

import spasm
from spasm.cli import main
from spasm.config import parse_config
from spasm.engine import Engine
from spasm.errors import ConfigError
from spasm.evaluation.compare import compare_conditions, goal_text
from spasm.evaluation.goals import goal_metrics
from spasm.evaluation.loader import load_run
from spasm.personas.persona import Persona
from spasm.runplan import dialogue_id, plan
from spasm.scenarios import load_scenarios, parse_scenarios
from spasm.testing import TestServer
from spasm.testing.replies import default_reply
from tests.conftest import config_from, endpoint_config, make_persona

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "configs" / "examples" / "scenarios.yaml"
SCENARIOS = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))["scenarios"]
GOAL_JUDGE = "decide whether the Client's goal was met"


def _judge(met: bool) -> Any:
    """A server reply: the goal judge says ``met`` (others answer as by default)."""

    def reply(body: dict[str, Any]) -> str:
        system = str(body["messages"][0].get("content", ""))
        if GOAL_JUDGE in system:
            return json.dumps({"goal_met": met, "reason": "judged met" if met else "judged unmet"})
        return default_reply(body)

    return reply


def _run(tmp_path: Path, met: bool = True, **overrides: Any) -> Path:
    out = tmp_path / "run"
    with TestServer(reply=_judge(met)) as srv:
        data = endpoint_config(srv.base_url, personas={"n": 2}, **overrides)
        summary = anyio.run(Engine(config_from(data), out, progress=False, sleep_scale=0.0).run)
    assert summary.completed == summary.planned, summary.line()
    return out


def test_scenarios_cross_personas_and_the_frames_keep_the_outcome_secret(tmp_path: Path) -> None:
    out = _run(tmp_path, scenarios=str(EXAMPLE), conditions=["ecp", "quoted"])
    dialogues = pd.read_parquet(out / "dialogues.parquet")
    assert len(dialogues) == 2 * 3 * 2  # personas × scenarios × conditions
    assert list(dialogues.columns[-3:]) == ["scenario_id", "goal_met", "goal_reason"]
    assert sorted(dialogues.scenario_id.unique()) == sorted(s["id"] for s in SCENARIOS)
    assert dialogues.goal_met.tolist() == [True] * len(dialogues)
    assert set(dialogues.goal_reason) == {"judged met"}
    by_id = {s["id"]: s for s in SCENARIOS}
    run = spasm.open_run(out)
    personas = run.personas.set_index("persona_id")
    for row in dialogues.to_dict("records"):
        s = by_id[row["scenario_id"]]
        assert f"-k0-s{s['id'].replace('-', '%2D')}-srv-srv-" in row["dialogue_id"]
        client, responder = row["client_system_prompt"], row["responder_system_prompt"]
        assert s["situation"] in client and s["goal"] in client
        assert s["expected_outcome"] not in client
        card = personas.loc[row["persona_id"], "card"]
        assert card in client and card not in responder
        for secret in (s["situation"], s["goal"], s["expected_outcome"]):
            assert secret not in responder
        if s.get("context"):
            assert s["context"] in responder and s["context"] not in client
        view = run.dialogue(row["dialogue_id"])
        for i, turn in enumerate(view.turns):
            seen = view.seen(i)
            assert seen.verified is True
            text = json.dumps(seen.messages)
            assert json.dumps(s["expected_outcome"])[1:-1] not in text
            if turn["speaker"] == "responder":
                assert json.dumps(card)[1:-1] not in text
    calls = run.calls
    judged = calls[calls.role == "goal_judge"]
    assert len(judged) == len(dialogues)  # one structured call a dialogue, logged
    assert set(judged.dialogue_id) == set(dialogues.dialogue_id)
    # The reader shows the columns (and the seeds differ per scenario).
    assert run.dialogues.groupby(["persona_id", "condition"]).seed.nunique().eq(3).all()


def test_the_goal_judge_as_a_termination_detector(tmp_path: Path) -> None:
    inline = [dict(SCENARIOS[0])]
    out = _run(tmp_path, scenarios=inline, scenarios_judge={"termination": True},
               termination={"rules": False, "min_utterances": 2},
               dialogue={"max_turns_per_agent": 5, "max_tokens": 40})
    d = pd.read_parquet(out / "dialogues.parquet")
    assert set(d.termination_reason) == {"goal_reached"}
    assert d.n_utterances.tolist() == [2, 2]
    assert d.goal_met.all() and set(d.termination_detail) == {"judged met"}
    calls = pd.read_parquet(out / "calls.parquet")
    # The detector's verdict is the decision: no second call after the dialogue.
    assert (calls.role == "goal_judge").sum() == len(d)


def test_an_unmet_goal_runs_to_the_cap_and_is_recorded(tmp_path: Path) -> None:
    out = _run(tmp_path, met=False, scenarios=[dict(SCENARIOS[1])],
               scenarios_judge={"termination": True},
               termination={"rules": False, "min_utterances": 2},
               dialogue={"max_turns_per_agent": 2, "max_tokens": 40})
    d = pd.read_parquet(out / "dialogues.parquet")
    assert set(d.termination_reason) == {"max_turns"} and not d.goal_met.any()
    assert set(d.goal_reason) == {"judged unmet"}
    # Goal success per condition with a Wilson interval, and in the comparison text.
    goals = goal_metrics(load_run(out).conversations)
    assert goals is not None
    overall = next(r for r in goals.rates if r.scenario_id == "all" and r.pairing == "all")
    assert (overall.n, overall.n_met, overall.rate, overall.ci_low) == (2, 0, 0.0, 0.0)
    assert 0 < (overall.ci_high or 0) < 1
    assert "Goal success" in goal_text(goals)


def test_runs_without_scenarios_keep_their_columns_and_ids(tmp_path: Path) -> None:
    out = _run(tmp_path)
    stored = pq.read_schema(next((out / "dialogues.parquet").glob("*.parquet"))).names
    assert not {"scenario_id", "goal_met", "goal_reason"} & set(stored)
    d = spasm.open_run(out).dialogues  # the reader shows them, empty
    assert d.scenario_id.isna().all() and d.goal_met.isna().all()
    assert all(did.endswith("-k0-srv-srv-ecp") for did in d.dialogue_id)
    assert dialogue_id("p1", 0, "a", "b", "ecp") == "p1-k0-a-b-ecp"
    assert dialogue_id("p1", 0, "a", "b", "ecp", "C", "x-y") == "p1-k0-sx%2Dy-a-b-ecp-C"
    assert parse_config({}).fingerprint() == parse_config(
        {"scenarios_judge": {"termination": True}}).fingerprint()
    assert parse_config({}).fingerprint() != parse_config({"scenarios": [SCENARIOS[0]]}).fingerprint()


def test_goal_success_is_compared_pairwise_per_scenario() -> None:
    rows = []
    for cond, met in (("ecp", [1, 1, 0, 1]), ("concat", [0, 1, 0, 0]), ("quoted", [1, 0, 0, 1])):
        for i, m in enumerate(met):
            rows.append({"dialogue_id": f"d{i}-{cond}", "persona_id": "p0", "conversation_index": 0,
                         "seed": 1, "pairing": "a/b", "condition": cond, "harness_level": "A",
                         "scenario_id": f"s{i}", "goal_met": float(m)})
    c = compare_conditions(pd.DataFrame(rows))
    assert "scenario_id" in c.pair_key and c.metrics == ["goal_met"]
    got = {(x.baseline, x.condition): (x.n_pairs, x.delta) for x in c.contrasts}
    assert got == {("ecp", "concat"): (4, 0.5), ("ecp", "quoted"): (4, 0.25),
                   ("concat", "quoted"): (4, -0.25)}


def test_a_persona_scenario_column_runs_that_scenario_only() -> None:
    cfg = parse_config({"scenarios": SCENARIOS})
    personas = [make_persona("p0", scenario="cancel-plan"), make_persona("p1", 1)]
    specs = list(plan(cfg, personas))
    assert [s.scenario.id for s in specs if s.persona.id == "p0"] == ["cancel-plan"]
    assert len([s for s in specs if s.persona.id == "p1"]) == 3
    with pytest.raises(ConfigError, match="names scenario 'nope'"):
        list(plan(cfg, [make_persona("p0", scenario="nope")]))


def test_jsonl_csv_and_yaml_files_read_the_same(tmp_path: Path) -> None:
    jsonl = tmp_path / "s.jsonl"
    jsonl.write_text("\n".join(json.dumps(s) for s in SCENARIOS) + "\n", encoding="utf-8")
    csv_file = tmp_path / "s.csv"
    pd.DataFrame(SCENARIOS).to_csv(csv_file, index=False)
    want = load_scenarios(EXAMPLE)
    assert load_scenarios(jsonl) == want == load_scenarios(csv_file)
    assert [s.id for s in want] == ["late-order", "double-charge", "cancel-plan"]


BAD_FILES: list[tuple[str, str, str]] = [
    ("a.yaml", "- id: a\n  situation: s\n  goal: g\n", r"a\.yaml, line 1: .*expected_outcome"),
    ("a.yaml", "- id: a\n  situation: s\n  goal: g\n  expected_outcome: o\n"
               "- id: a\n  situation: s\n  goal: g\n  expected_outcome: o\n",
     r"a\.yaml, line 5: scenario id 'a' repeats line 1"),
    ("a.yaml", "- id: 'a/b'\n  situation: s\n  goal: g\n  expected_outcome: o\n",
     r"line 1: scenario id 'a/b' is not allowed"),
    ("a.yaml", "- id: a\n  situaton: s\n  goal: g\n  expected_outcome: o\n",
     r"line 1: .*situaton: unknown field"),
    ("a.yaml", "- [1, 2]\n", r"line 1: a scenario is a mapping"),
    ("a.yaml", "id: a\n", r"a scenario file is a list"),
    ("a.yaml", "- id: a\n  goal: [unclosed\n", r"a\.yaml, line \d+: not valid YAML"),
    ("a.yaml", "[]\n", r"no scenarios"),
    ("a.jsonl", '{"id": "a", "situation": "s", "goal": "g", "expected_outcome": "o"}\n{"id": \n',
     r"a\.jsonl, line 2, column \d+: not valid JSON"),
    ("a.jsonl", '{"id": "a", "situation": "s", "goal": "g", "expected_outcome": "o"}\n[1]\n',
     r"a\.jsonl, line 2: a scenario is a mapping"),
    ("a.csv", "id,situation,goal,expected_outcome\na,s,g,o\nb,s,g\n", r"a\.csv, line 3: .*expected_outcome"),
    ("a.csv", "id,situation,goal,expected_outcome\na,s,g,o,extra\n", r"a\.csv, line 2: more values"),
    ("a.csv", b"id,situation,goal,expected_outcome\na,s\xff,g,o\n".decode("latin-1"), r"line 2: not UTF-8"),
]


@pytest.mark.parametrize(("name", "content", "message"), BAD_FILES)
def test_bad_scenario_files_name_the_file_and_line(
    name: str, content: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / name
    if "not UTF-8" in message:
        path.write_bytes(content.encode("latin-1"))
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        load_scenarios(path)


def test_inline_scenarios_are_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"config scenarios, scenario 2: .*goal"):
        parse_scenarios([(None, SCENARIOS[0]), (None, {"id": "b", "situation": "s"})],
                        "config scenarios")


def test_fuzzed_scenario_files_are_exit_2_with_a_message_never_a_traceback(
    tmp_path: Path, capsys: Any
) -> None:
    rng = random.Random(18)
    seed = EXAMPLE.read_bytes()
    outcomes: dict[int, int] = {}
    values: list[Any] = [None, True, 0, -1, 3.5, "", "x" * 5000, "a/b", [], {}, [1, "a"], {"k": [None]}]
    for i in range(24):
        case = tmp_path / f"case{i}"
        case.mkdir()
        pick = i % 3
        if pick == 0:  # random bytes or a truncated file
            content = bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))) if i % 2 else \
                seed[: rng.randint(1, len(seed))]
        else:  # one field replaced
            doc = yaml.safe_load(seed)
            item = rng.choice(doc["scenarios"])
            item[rng.choice([*item, "extra"])] = rng.choice(values)
            content = yaml.safe_dump(doc).encode()
        path = case / "scenarios.yaml"
        path.write_bytes(content)
        config = case / "config.yaml"
        config.write_text(yaml.safe_dump({"name": "f", "personas": {"n": 1},
                                          "scenarios": str(path)}), encoding="utf-8")
        code = main(["generate", "--config", str(config), "--out", str(case / "out"), "--dry-run",
                     "--no-progress"])
        err = capsys.readouterr().err
        assert code in (0, 2), (i, code, content[:200], err)
        assert "Traceback" not in err
        if code == 2:
            assert err.startswith("error: ") and str(path) in err, (i, err)
            assert not (case / "out").exists()
        outcomes[code] = outcomes.get(code, 0) + 1
    assert outcomes.get(2, 0) >= 12


def test_the_example_config_plans_personas_by_scenarios_by_conditions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spasm.config import load_config

    monkeypatch.chdir(ROOT)  # the example names its scenario file from the repository root
    cfg = load_config(ROOT / "configs" / "examples" / "scenarios-run.yaml")
    specs = list(plan(cfg, [make_persona("p0"), make_persona("p1", 1)]))
    assert len(specs) == 2 * 3 * 3
    assert {s.condition for s in specs} == {"ecp", "concat", "quoted"}


PEOPLE = """id,first_name,age,occupation,concern,emotion,motivation,{column}
a1,Aisha,34,Nurse,a charge I do not recognise,anxious,wants it reversed,late-order
a2,Tomasz,67,Retiree,a late pension payment,frustrated,wants a guarantee,{second}
a3,Mei,29,Barista,a doubled phone bill,impatient,wants it fixed,
"""


@pytest.mark.parametrize("column, second", [("scenario", "cancel-plan"),
                                            (" Scenario ", " cancel-plan ")])
def test_a_scenario_column_of_a_persona_file_runs_that_scenario_only(
        tmp_path: Path, column: str, second: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's promise, through the CLI: a persona whose row names a scenario runs that
    one only (the column is matched like a field: case and spaces do not count), a persona
    with an empty cell runs every scenario, and a resumed run reads the choice back from its
    personas table (nothing new is planned)."""
    people = tmp_path / "people.csv"
    people.write_text(PEOPLE.format(column=column, second=second), encoding="utf-8")
    run = tmp_path / "run"
    with TestServer(reply=_judge(True)) as srv:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump(endpoint_config(
            srv.base_url, scenarios=str(EXAMPLE), personas={"source": str(people)})))
        args = ["generate", "--config", str(config), "--out", str(run), "--no-progress"]
        assert main(args) == 0, capsys.readouterr().err
        calls = len(pd.read_parquet(run / "calls.parquet"))
        assert main(args) == 0  # a resume: the same plan, read from the stored personas
    assert len(pd.read_parquet(run / "calls.parquet")) == calls  # nothing new was planned
    personas = pd.read_parquet(run / "personas.parquet").set_index("persona_id").source_id
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    ran = {sid: sorted(g.scenario_id) for sid, g in
           dialogues.assign(sid=dialogues.persona_id.map(personas)).groupby("sid")}
    assert ran == {"a1": ["late-order"], "a2": ["cancel-plan"],
                   "a3": sorted(s["id"] for s in SCENARIOS)}


def test_a_persona_files_scenario_cells_read_as_ids_or_none() -> None:
    """The neighbours of a CSV cell: JSONL numbers, Parquet nulls (NaN), blanks, a schema field."""
    from spasm.scenarios import own_scenario

    def row(value: Any) -> Persona:
        return Persona(id="p", index=0, card="",
                       source_fields=json.dumps({"scenario": value}, allow_nan=True))

    assert own_scenario(row("late-order")) == "late-order"
    assert own_scenario(row(7)) == "7" and own_scenario(row(7.0)) == "7"
    assert [own_scenario(row(v)) for v in (None, "", "  ", float("nan"))] == [None] * 4
    assert own_scenario(dataclasses.replace(row("y"), fields={"scenario": "x"})) == "x"
    assert own_scenario(dataclasses.replace(row("y"), source_fields="{not json")) is None
    cfg = parse_config({"scenarios": SCENARIOS})
    with pytest.raises(ConfigError, match="names scenario '7'"):
        list(plan(cfg, [row(7)]))


def test_a_scenario_column_in_a_run_without_scenarios_is_said_and_a_group_run_refuses_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    people = tmp_path / "people.csv"
    people.write_text(PEOPLE.format(column="scenario", second=""), encoding="utf-8")
    with TestServer() as srv:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump(endpoint_config(srv.base_url,
                                                         personas={"source": str(people)})))
        assert main(["generate", "--config", str(config), "--out", str(tmp_path / "run"),
                     "--no-progress"]) == 0
    said = [r.getMessage() for r in caplog.records if "name a scenario" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("1 of the personas of") and \
        "name a scenario (column 'scenario'), but the run has no scenarios" in said[0], said
    # In a group run the seats are drawn from every persona: a data file's own scenario is
    # refused as the schema field is (tests/test_group_scenarios.py).
    from spasm.runplan import plan_groups
    from tests.test_group_scenarios import _data, _personas

    personas = _personas()
    personas[2] = dataclasses.replace(personas[2], source_fields=json.dumps({"Scenario": "cancel-plan"}))
    cfg = parse_config(_data("http://127.0.0.1:9/v1", scenarios=SCENARIOS), "<t>")
    with pytest.raises(ConfigError, match=r"persona 'p2' names its own scenario \('cancel-plan'\)"):
        list(plan_groups(cfg, personas))

"""A resumed run never silently picks up a changed scenario file, and the plan-size check
counts scenarios.

The config names a scenario file by its path, so the run's fingerprint cannot see an edit: the
manifest records a digest of the scenarios as parsed (``scenarios``), a resume after an edit is
exit 2 naming the file and the ids (nothing written), an unchanged (or only reformatted) file
resumes into the same dataset as an uninterrupted run, a run whose manifest has no such record
resumes unchecked, and ``spasm merge`` refuses shards that ran different scenarios. All on the test
server through ``spasm generate`` / ``spasm merge``, tables read back from Parquet.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from spasm.cli import main
from spasm.config import parse_config
from spasm.dataset import open_run
from spasm.errors import ConfigError
from spasm.scenarios import scenario_changes, scenarios_record
from spasm.testing import TestServer
from spasm.testing.replies import default_reply
from tests.conftest import endpoint_config
from tests.test_scenarios import GOAL_JUDGE, SCENARIOS
from tests.test_shards import sorted_rows

PLANNED = 2 * 3  # personas × scenarios (one condition, one conversation)


def _reply(body: dict[str, Any]) -> str:
    """The goal judge says met; every other call is answered as by default."""
    if GOAL_JUDGE in str(body["messages"][0].get("content", "")):
        return json.dumps({"goal_met": True, "reason": "judged met"})
    return default_reply(body)


@pytest.fixture(scope="module")
def server() -> Any:
    with TestServer(reply=_reply) as srv:
        yield srv


def _scenario_file(tmp: Path, scenarios: list[dict[str, Any]], name: str = "scenarios.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump({"scenarios": scenarios}, sort_keys=False), encoding="utf-8")
    return path


def _config(tmp: Path, base_url: str, scenarios: Path, **overrides: Any) -> str:
    data = endpoint_config(base_url, personas={"n": 2}, scenarios=str(scenarios), **overrides)
    path = tmp / "run.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def _generate(config: str, out: Path, *extra: str) -> int:
    return main(["generate", "--config", config, "--out", str(out), "--no-progress", *extra])


def _pilot(config: str, out: Path) -> None:
    """A run with two of its six dialogues done (`--dry-run --pilot 2` keeps them)."""
    assert _generate(config, out, "--dry-run", "--pilot", "2") == 0
    assert len(open_run(out).dialogues) == 2
    assert json.loads((out / "manifest.json").read_text())["status"] == "incomplete"


def _files(run: Path) -> dict[str, bytes]:
    """Every file of a run directory and its bytes (but the lock file, which comes and goes)."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def _edited() -> list[dict[str, Any]]:
    """The example's scenarios with one situation changed, one removed and one added."""
    edited = copy.deepcopy(SCENARIOS)
    assert [s["id"] for s in edited] == ["late-order", "double-charge", "cancel-plan"]
    edited[1]["situation"] = "Your statement shows the same payment three times."
    del edited[2]
    edited.append({"id": "new-address", "situation": "You moved house.", "goal": "Update it.",
                   "expected_outcome": "The agent updates the address."})
    return edited


@pytest.mark.e2e
def test_an_edited_scenario_file_stops_the_resume_and_the_restored_one_resumes(
    tmp_path: Path, server: TestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    scenarios = _scenario_file(tmp_path, SCENARIOS)
    cfg = _config(tmp_path, server.base_url, scenarios)
    reference = tmp_path / "reference"
    assert _generate(cfg, reference) == 0
    run = tmp_path / "run"
    _pilot(cfg, run)
    record = json.loads((run / "manifest.json").read_text())["scenarios"]
    assert record == json.loads((reference / "manifest.json").read_text())["scenarios"]
    assert record["source"] == str(scenarios) and record["count"] == 3
    assert sorted(record["by_id"]) == ["cancel-plan", "double-charge", "late-order"]
    before = _files(run)
    capsys.readouterr()

    _scenario_file(tmp_path, _edited())
    assert _generate(cfg, run) == 2
    err = capsys.readouterr().err
    assert f"the scenario file {scenarios} changed since {run} was started" in err
    assert "changed: double-charge; added: new-address; removed: cancel-plan" in err
    assert "Restore the file" in err and "another --out" in err and "Traceback" not in err
    assert _files(run) == before  # nothing new written: no dialogue, no manifest, no config

    # The same scenarios in another layout and order (and a comment) are the same content.
    text = "# reordered\n" + yaml.safe_dump(list(reversed(SCENARIOS)), default_flow_style=True)
    scenarios.write_text(text, encoding="utf-8")
    assert _generate(cfg, run) == 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["scenarios"] == record
    for table in ("personas", "dialogues", "turns"):
        pd.testing.assert_frame_equal(sorted_rows(run, table), sorted_rows(reference, table))
    assert len(open_run(run).dialogues) == PLANNED


def test_a_run_from_before_the_record_resumes_as_before(
    tmp_path: Path, server: TestServer
) -> None:
    scenarios = _scenario_file(tmp_path, SCENARIOS)
    cfg = _config(tmp_path, server.base_url, scenarios)
    run = tmp_path / "run"
    _pilot(cfg, run)
    manifest = json.loads((run / "manifest.json").read_text())
    del manifest["scenarios"]  # a manifest without the record
    (run / "manifest.json").write_text(json.dumps(manifest))
    _scenario_file(tmp_path, _edited())
    assert _generate(cfg, run) == 0  # no record, no check
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and "scenarios" not in manifest
    ids = set(open_run(run).dialogues.scenario_id)
    assert "new-address" in ids  # the edited file's scenarios ran (the hole the record closes)


def test_an_edit_before_any_dialogue_is_stored_is_recorded(
    tmp_path: Path, server: TestServer
) -> None:
    scenarios = _scenario_file(tmp_path, SCENARIOS)
    cfg = _config(tmp_path, server.base_url, scenarios)
    run = tmp_path / "run"
    # The token cap stops the run after its personas, before the first dialogue is stored.
    assert _generate(cfg, run, "--max-tokens", "1") == 3
    assert not open_run(run).has("dialogues") or open_run(run).dialogues.empty
    _scenario_file(tmp_path, _edited())
    assert _generate(cfg, run) == 0  # nothing ran with the old file: nothing to mix
    manifest = json.loads((run / "manifest.json").read_text())
    assert sorted(manifest["scenarios"]["by_id"]) == ["double-charge", "late-order", "new-address"]
    assert set(open_run(run).dialogues.scenario_id) == {"double-charge", "late-order", "new-address"}


@pytest.mark.e2e
def test_merge_refuses_shards_that_ran_different_scenarios(
    tmp_path: Path, server: TestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    scenarios = _scenario_file(tmp_path, SCENARIOS)
    cfg = _config(tmp_path, server.base_url, scenarios)
    s0, s1, again = tmp_path / "s0", tmp_path / "s1", tmp_path / "s1-again"
    assert _generate(cfg, s0, "--shard", "0/2") == 0
    _scenario_file(tmp_path, _edited())
    assert _generate(cfg, s1, "--shard", "1/2") == 0  # the same config: only the file changed
    capsys.readouterr()
    merged = tmp_path / "merged"
    assert main(["merge", str(s0), str(s1), "--out", str(merged)]) == 2
    err = capsys.readouterr().err
    assert f"ran different scenarios: the scenario file {scenarios} changed between them" in err
    assert "changed: double-charge; added: new-address; removed: cancel-plan" in err
    assert "Nothing was written" in err and "Traceback" not in err
    assert not merged.exists() and not [p for p in tmp_path.iterdir() if ".merging" in p.name]
    # The file restored and the other shard rerun, the shards merge.
    _scenario_file(tmp_path, SCENARIOS)
    assert _generate(cfg, again, "--shard", "1/2") == 0
    assert main(["merge", str(s0), str(again), "--out", str(merged)]) == 0
    assert len(open_run(merged).dialogues) == PLANNED
    assert open_run(merged).manifest["scenarios"]["sha256"] == open_run(s0).manifest[
        "scenarios"]["sha256"]


def test_scenario_changes_without_per_id_digests_say_the_counts() -> None:
    cfg = parse_config(endpoint_config("http://127.0.0.1:9", scenarios=SCENARIOS))
    record = scenarios_record(cfg)
    assert record is not None and record["source"] == "config"
    fewer = scenarios_record(parse_config(endpoint_config("http://127.0.0.1:9",
                                                          scenarios=SCENARIOS[:2])))
    assert fewer is not None and fewer["sha256"] != record["sha256"]
    assert scenario_changes(record, fewer) == "removed: cancel-plan"
    bare = {k: v for k, v in record.items() if k != "by_id"}
    assert scenario_changes(bare, fewer) == "3 scenarios before, 2 now; their content differs"


# -- the plan size -------------------------------------------------------------------------------
def test_inline_scenarios_count_in_the_plan_size() -> None:
    base = endpoint_config("http://127.0.0.1:9", personas={"n": 10},
                           engine={"max_planned_dialogues": 20})
    parse_config(base)  # 10 dialogues: within the limit
    with pytest.raises(ConfigError) as exc:
        parse_config({**base, "scenarios": SCENARIOS})
    message = str(exc.value)
    assert "the plan has 30 dialogues" in message
    assert ("personas × conversations × pairings × conditions × harness levels × scenarios = "
            "10 × 1 × 1 × 1 × 1 × 3") in message
    assert "engine.max_planned_dialogues = 20" in message


def test_a_scenario_file_counts_in_the_plan_size_when_it_is_read(
    tmp_path: Path, server: TestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    scenarios = _scenario_file(tmp_path, SCENARIOS)
    run = tmp_path / "run"
    cfg = _config(tmp_path, server.base_url, scenarios, engine={"max_planned_dialogues": 5})
    capsys.readouterr()
    assert _generate(cfg, run) == 2
    err = capsys.readouterr().err
    assert f"the plan has 6 dialogues (3 scenarios in {scenarios})" in err
    assert "2 × 1 × 1 × 1 × 1 × 3" in err and "engine.max_planned_dialogues = 5" in err
    assert not run.exists()
    # Personas from a data file without n: its rows times the scenarios.
    people = tmp_path / "people.csv"
    people.write_text("card\n" + "".join(f"You are customer number {i}.\n" for i in range(3)),
                      encoding="utf-8")
    data = endpoint_config(server.base_url, personas={"source": str(people), "n": None},
                           scenarios=str(scenarios), engine={"max_planned_dialogues": 8})
    path = tmp_path / "source.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert _generate(str(path), run) == 2
    err = capsys.readouterr().err
    assert f"the plan has 9 dialogues (3 personas from {people}; 3 scenarios in {scenarios})" in err
    assert "3 × 1 × 1 × 1 × 1 × 3" in err and "Traceback" not in err
    assert not run.exists()

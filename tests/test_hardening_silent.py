"""Nothing silent (issue 28, items 7 to 13): degradations that are counted and said, judges that
never default to code, outputs that never replace another's, and bad input that ends as exit 2
with the file, the line and what to do.

Through the real CLI (in-process) and the engine against the loopback test server; what is
written is read back from disk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spasm.cli import main
from spasm.config import parse_config
from spasm.errors import ConfigError
from spasm.testing import TestServer
from spasm.testing.replies import default_reply
from tests.conftest import endpoint_config

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = {"id": "refund", "situation": "A kettle arrived broken.", "goal": "Get a refund.",
            "expected_outcome": "The agent issues a refund.", "context": "Refunds within 30 days."}


def _write(tmp: Path, data: dict[str, Any], name: str = "c.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(data))
    return path


def _unparsable_for(marker: str) -> Any:
    """A server reply: requests whose system prompt holds ``marker`` get prose, never JSON."""
    def reply(body: dict[str, Any]) -> str:
        system = str(body["messages"][0].get("content", "")) if body.get("messages") else ""
        if marker in system:
            return "I think so, more or less."
        return default_reply(body)
    return reply


# -- item 7: a goal judge that never parses, a moderator that never answers ---------------------
def test_a_goal_judge_that_never_parses_is_counted_in_the_summary_and_manifest_and_warned(
    tmp_path: Path, capsys: Any, caplog: Any
) -> None:
    with TestServer(reply=_unparsable_for("whether the Client's goal was met")) as srv:
        cfg = _write(tmp_path, endpoint_config(srv.base_url, personas={"n": 2}, scenarios=[SCENARIO]))
        assert main(["generate", "--config", str(cfg), "--out", str(tmp_path / "run"),
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "2 goal verdicts missing" in out
    assert "the goal judge gave no usable verdict for 2 dialogue(s)" in caplog.text
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["counts"]["goal_unjudged_this_pass"] == 2
    dialogues = pd.read_parquet(tmp_path / "run" / "dialogues.parquet")
    assert dialogues.goal_met.isna().all()


def test_a_goal_judge_that_answers_is_not_counted(tmp_path: Path, capsys: Any, caplog: Any) -> None:
    with TestServer() as srv:
        cfg = _write(tmp_path, endpoint_config(srv.base_url, personas={"n": 2}, scenarios=[SCENARIO]))
        assert main(["generate", "--config", str(cfg), "--out", str(tmp_path / "run"),
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "goal verdicts missing" not in out and "goal judge" not in caplog.text
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["counts"]["goal_unjudged_this_pass"] == 0


def _group(base_url: str, **overrides: Any) -> dict[str, Any]:
    data = endpoint_config(base_url, personas={"n": 2}, **overrides, participants=[
        {"id": "Ana", "role": "client", "backend": "srv"},
        {"id": "Ben", "role": "client", "backend": "srv"},
        {"id": "Host", "role": "responder", "backend": "srv"},
    ])
    data.pop("pairings")
    return data


def test_an_llm_moderator_that_never_answers_usably_is_counted_and_warned(
    tmp_path: Path, capsys: Any, caplog: Any
) -> None:
    with TestServer(reply=_unparsable_for("You moderate a group conversation")) as srv:
        data = _group(srv.base_url, group={"next_speaker": "llm", "max_utterances": 6})
        cfg = _write(tmp_path, data)
        assert main(["generate", "--config", str(cfg), "--out", str(tmp_path / "run"),
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    turns = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    fallbacks = int(turns.next_speaker_reason.fillna("").str.endswith(": round robin").sum())
    assert fallbacks > 0
    assert f"{fallbacks} moderator fallbacks" in out
    assert f"the llm moderator gave no usable answer {fallbacks} time(s)" in caplog.text
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["counts"]["moderator_fallbacks_this_pass"] == fallbacks


# -- item 8: judges and moderators never default to code -----------------------------------------
def _python_backend() -> dict[str, Any]:
    return {"kind": "python", "target": "examples/responder.py:respond"}


@pytest.mark.parametrize("case", ["goal_judge", "termination_judge", "moderator", "validator"])
def test_a_judge_or_moderator_never_defaults_to_a_python_backend(case: str) -> None:
    srv = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    data = endpoint_config("http://127.0.0.1:9/v1")
    data["backends"] = {"srv": srv, "bot": _python_backend()}
    if case == "goal_judge":  # the Client is the code: the judge would read the expected outcome
        data["pairings"] = [{"client": "bot", "responder": "srv"}]
        data["scenarios"] = [SCENARIO]
        key = "scenarios_judge.backend"
    elif case == "termination_judge":
        data["pairings"] = [{"client": "srv", "responder": "srv"}, {"client": "bot", "responder": "srv"}]
        data["termination"] = {"judge": True}
        key = "termination.judge_backend"
    elif case == "validator":
        data["pairings"] = [{"client": "bot", "responder": "srv"}]
        data["personas"] = {"n": 2, "llm_validate": True}
        key = "personas.backend"
    else:
        data = _group("http://127.0.0.1:9/v1", group={"next_speaker": "llm"})
        data["backends"]["bot"] = _python_backend()
        data["participants"][2]["backend"] = "bot"
        key = "group.moderator_backend"
    with pytest.raises(ConfigError) as err:
        parse_config(data, "c.yaml")
    assert f"{key} is not set" in str(err.value) and "kind: python" in str(err.value)
    assert "'srv'" in str(err.value)  # the model backend it could name
    # Naming a model backend explicitly is the fix.
    section, _, field = key.partition(".")
    data.setdefault(section, {})[field] = "srv"
    parse_config(data, "c.yaml")


def test_a_python_responder_with_a_judge_on_the_model_client_is_accepted() -> None:
    data = endpoint_config("http://127.0.0.1:9/v1", scenarios=[SCENARIO],
                           termination={"judge": True})
    data["backends"]["bot"] = _python_backend()
    data["pairings"] = [{"client": "srv", "responder": "bot"}]
    parse_config(data, "c.yaml")  # the defaults ask the Client, a model: nothing to refuse


def test_the_cli_says_which_key_to_set_for_a_python_client_with_scenarios(
    tmp_path: Path, capsys: Any
) -> None:
    data = endpoint_config("http://127.0.0.1:9/v1", scenarios=[SCENARIO])
    data["backends"]["bot"] = _python_backend()
    data["pairings"] = [{"client": "bot", "responder": "srv"}]
    cfg = _write(tmp_path, data)
    assert main(["generate", "--config", str(cfg), "--out", str(tmp_path / "run"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "scenarios_judge.backend is not set" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


# -- item 9: eval, card and personas never replace another's output ------------------------------
@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("two")
    with TestServer() as srv:
        for name, seed in (("a", 1), ("b", 2)):
            cfg = _write(tmp, endpoint_config(srv.base_url, seed=seed, personas={"n": 2}), f"{name}.json")
            assert main(["generate", "--config", str(cfg), "--out", str(tmp / name),
                         "--no-progress"]) == 0
    return tmp / "a", tmp / "b"


@pytest.fixture
def runs(two_runs: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    a, b = two_runs
    return Path(shutil.copytree(a, tmp_path / "a")), Path(shutil.copytree(b, tmp_path / "b"))


def test_eval_of_one_run_never_replaces_another_runs_evaluation(
    runs: tuple[Path, Path], capsys: Any
) -> None:
    pytest.importorskip("sklearn")
    a, b = runs
    assert main(["eval", str(b), "--no-progress"]) == 0
    before = (b / "eval" / "metrics.json").read_bytes()
    capsys.readouterr()
    for flags in ([], ["--overwrite"]):
        assert main(["eval", str(a), "--out", str(b / "eval"), "--no-progress", *flags]) == 2
        err = capsys.readouterr().err
        assert f"is inside the run {b}" in err and "Traceback" not in err
    assert (b / "eval" / "metrics.json").read_bytes() == before
    # Not into a new folder of B either (it would read as B's), and the refusal of --out B
    # suggests A's own place, not B/eval.
    assert main(["eval", str(a), "--out", str(b / "elsewhere"), "--no-progress"]) == 2
    assert main(["eval", str(a), "--out", str(b), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"e.g. {a / 'eval'}" in err and f"e.g. {b / 'eval'}" not in err
    assert not (b / "elsewhere").exists()


@pytest.mark.e2e
def test_eval_replaces_an_earlier_evaluation_outside_the_run_only_with_overwrite(
    runs: tuple[Path, Path], tmp_path: Path, capsys: Any
) -> None:
    pytest.importorskip("sklearn")
    a, b = runs
    out = tmp_path / "report"
    assert main(["eval", str(b), "--out", str(out), "--no-progress"]) == 0
    before = (out / "metrics.json").read_bytes()
    capsys.readouterr()
    assert main(["eval", str(a), "--out", str(out), "--no-progress"]) == 2
    assert "pass --overwrite to replace it" in capsys.readouterr().err
    assert (out / "metrics.json").read_bytes() == before
    assert main(["eval", str(a), "--out", str(out), "--no-progress", "--overwrite"]) == 0
    # Its own RUN/eval is replaced as before, without a flag.
    assert main(["eval", str(a), "--no-progress"]) == 0
    assert main(["eval", str(a), "--no-progress"]) == 0


def test_card_never_writes_into_another_run_nor_over_a_file_without_overwrite(
    runs: tuple[Path, Path], tmp_path: Path, capsys: Any
) -> None:
    a, b = runs
    assert main(["card", str(b), "--out", str(b / "card.md")]) == 0
    before = (b / "card.md").read_bytes()
    capsys.readouterr()
    for flags in ([], ["--overwrite"]):
        assert main(["card", str(a), "--out", str(b / "card.md"), *flags]) == 2
        assert f"is inside the run {b}" in capsys.readouterr().err
    assert (b / "card.md").read_bytes() == before
    notes = tmp_path / "notes.md"
    notes.write_text("my notes")
    assert main(["card", str(a), "--out", str(notes)]) == 2
    err = capsys.readouterr().err
    assert "exists; choose another file or pass --overwrite" in err and "Traceback" not in err
    assert notes.read_text() == "my notes"
    assert main(["card", str(a), "--out", str(notes), "--overwrite"]) == 0
    assert notes.read_text().startswith("---")
    # Its own run's card is written (and rewritten with --overwrite).
    assert main(["card", str(a), "--out", str(a / "card.md")]) == 0
    assert main(["card", str(a), "--out", str(a / "card.md")]) == 2
    assert main(["card", str(a), "--out", str(a / "card.md"), "--overwrite"]) == 0


@pytest.mark.parametrize("mode", ["sample", "from"])
def test_personas_never_writes_over_an_existing_file_without_overwrite(
    mode: str, tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "people.parquet"
    out.write_text("not mine to replace")
    source = ["--from", str(ROOT / "configs" / "examples" / "personas.csv")]
    argv = ["personas", "--out", str(out), *(["--n", "2"] if mode == "sample" else source)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "exists; choose another file or pass --overwrite" in err and "Traceback" not in err
    assert out.read_text() == "not mine to replace"
    assert main([*argv, "--overwrite"]) == 0
    assert len(pd.read_parquet(out)) >= 2


# -- item 11: an edited personas.source is refused on resume, as a scenario file is ---------------
_ROWS = ("id,first_name,age,occupation,city,concern,emotion,motivation\n"
         "a1,Aisha,34,Nurse,Leeds,a card payment I do not recognise,anxious,wants it reversed\n"
         "a2,Tomasz,67,Retiree,Gdansk,my pension arrived late,frustrated,needs a guarantee\n")


@pytest.mark.parametrize("edit", ["changed", "added", "removed", "rejected_row_fixed"])
def test_an_edited_persona_file_is_refused_on_resume_naming_the_rows(
    edit: str, server: TestServer, tmp_path: Path, capsys: Any
) -> None:
    people = tmp_path / "people.csv"
    rows = _ROWS + ("a3,,,,,,,\n" if edit == "rejected_row_fixed" else "")
    people.write_text(rows)
    data = endpoint_config(server.base_url, personas={"source": str(people)})
    data["personas"].pop("n", None)
    cfg = _write(tmp_path, data)
    argv = ["generate", "--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]
    assert main(argv) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["personas_source"]["count"] == (3 if edit == "rejected_row_fixed" else 2)
    capsys.readouterr()
    # The same file: nothing to do, and said so as before.
    assert main(argv) == 0
    assert "0 new" in capsys.readouterr().out
    before = (tmp_path / "run" / "dialogues.parquet").exists()
    if edit == "changed":
        people.write_text(rows.replace("Leeds", "York"))
    elif edit == "added":
        people.write_text(rows + "a9,Mei,29,Barista,Vancouver,billed twice,annoyed,wants it fixed\n")
    elif edit == "removed":
        people.write_text(rows.rsplit("a2,", 1)[0])
    else:
        fixed = "a3,Mei,29,Barista,Vancouver,billed twice,annoyed,wants it"
        people.write_text(rows.replace("a3,,,,,,,", fixed))
    assert main(argv) == 2
    err = capsys.readouterr().err
    expected = {"changed": "changed: a1", "added": "added: a9", "removed": "removed: a2",
                "rejected_row_fixed": "changed: a3"}[edit]
    assert f"the persona file {people} changed since" in err and expected in err, err
    assert "Traceback" not in err and before
    # Restoring the file resumes again; --overwrite starts over with the edit.
    people.write_text(rows)
    assert main(argv) == 0

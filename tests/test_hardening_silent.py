"""Nothing silent: degradations that are counted and said, judges that
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

import anyio
import pandas as pd
import pytest

from spasm.cli import main
from spasm.config import parse_config
from spasm.engine import Engine
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


# -- a goal judge that never parses, a moderator that never answers -----------------------------
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


# -- judges and moderators never default to code -------------------------------------------------
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


# -- eval, card and personas never replace another's output --------------------------------------
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


@pytest.mark.e2e
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
    # Its own RUN/eval is replaced without a flag.
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


# -- an edited personas.source is refused on resume, as a scenario file is ------------------------
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
    # The same file: nothing to do, and said so.
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


# -- bad input is exit 2 with the file, the line and what to do, never a traceback --------------
_HUGE = "9" * 5000
_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("value", [_HUGE, "-" + _HUGE, _DEEP, '{"a": ' * 5000 + "1" + "}" * 5000])
def test_a_scenario_jsonl_with_a_huge_number_or_deep_nesting_names_the_line(
    value: str, tmp_path: Path, capsys: Any
) -> None:
    good = json.dumps(SCENARIO)
    (tmp_path / "s.jsonl").write_text(good + "\n" + good[:-1] + f', "extra": {value}}}\n')
    cfg = _write(tmp_path, endpoint_config("http://127.0.0.1:9/v1", scenarios=str(tmp_path / "s.jsonl")))
    assert main(["generate", "--config", str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 's.jsonl'}, line 2: cannot be read" in err and "Traceback" not in err


@pytest.mark.parametrize("value", [_HUGE, _DEEP])
def test_export_check_reports_a_huge_number_or_deep_nesting_as_invalid_json(
    value: str, tmp_path: Path, capsys: Any
) -> None:
    good = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    path = tmp_path / "train.jsonl"
    path.write_text(f"{good}\n" + '{"messages": [], "x": ' + value + "}\n")
    assert main(["export", "--check", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "line 2: invalid_json (a number with thousands of digits, or nesting too deep)" in out
    assert "Traceback" not in err


def test_export_check_of_a_directory_says_so_and_names_its_files(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "openai").mkdir()
    (tmp_path / "openai" / "train.jsonl").write_text("")
    assert main(["export", "--check", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--check {tmp_path} is a directory" in err and "openai/train.jsonl" in err
    assert "no such file" not in err


def test_a_persona_csv_cell_over_128_kib_and_a_huge_card_from_jsonl_are_named(
    tmp_path: Path, capsys: Any
) -> None:
    card = "You are Ana. " + "x" * 200_000
    csv_file = tmp_path / "p.csv"
    csv_file.write_text(f'id,card\na1,"You are Ben."\na2,"{card}"\n')
    assert main(["personas", "--from", str(csv_file)]) == 2
    err = capsys.readouterr().err
    assert f"{csv_file}:3: a cell holds more than 131,072 characters" in err
    assert "not valid CSV" not in err and "Traceback" not in err
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"id": "a1", "card": "You are Ben."}) + "\n"
                     + json.dumps({"id": "a2", "card": card}) + "\n")
    assert main(["personas", "--from", str(jsonl)]) == 0
    out = capsys.readouterr().out
    assert "the card holds 200,013 characters, over 131,072" in out and "1 usable" in out


def test_a_row_with_only_a_persona_text_is_used_in_a_file_that_also_has_descriptions(
    tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a1", "description": "A retired nurse in Leeds."}) + "\n"
                    + json.dumps({"id": "a2", "persona": "A barista in Vancouver."}) + "\n"
                    + json.dumps({"id": "a3", "description": "A pilot.", "persona": "ignored"}) + "\n")
    from spasm.personas import load_schema
    from spasm.personas.sources import load_source

    source = load_source(path, load_schema(None))
    assert [c.source_id for c in source.accepted] == ["a1", "a2", "a3"] and not source.rejected
    cards = {c.source_id: c.card for c in source.accepted}
    assert "barista" in cards["a2"] and "pilot" in cards["a3"] and "ignored" not in cards["a3"]


def test_a_target_whose_own_import_fails_or_has_a_syntax_error_is_told_so(
    server: TestServer, tmp_path: Path, capsys: Any
) -> None:
    agent = tmp_path / "agent.py"
    cases = {
        "import not_a_real_module_xyz\n\ndef respond(m, c):\n    return 'hi'\n":
            ("it imports 'not_a_real_module_xyz', which is not installed", f"{agent}:1"),
        "def respond(m, c):\n    return 'hi'\n\ndef broken(:\n    pass\n":
            ("SyntaxError", f"at {agent}:4"),
    }
    for n, (source, (what, where)) in enumerate(cases.items()):
        agent = tmp_path / f"agent{n}.py"
        agent.write_text(source)
        where = where.replace(str(tmp_path / "agent.py"), str(agent))
        data = endpoint_config(server.base_url)
        data["backends"]["bot"] = {"kind": "python", "target": f"{agent}:respond"}
        data["pairings"] = [{"client": "srv", "responder": "bot"}]
        cfg = _write(tmp_path, data)
        assert main(["generate", "--config", str(cfg), "--out", str(tmp_path / f"run{n}"),
                     "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert what in err and where in err, err
        assert "name the file" not in err and "<frozen" not in err and "Traceback" not in err


@pytest.mark.parametrize("bad", ["Ana Maria", "Ana-Maria", "José", "1st", "A" * 30, ""])
def test_a_participant_id_is_refused_with_its_rule_in_words(bad: str) -> None:
    data = _group("http://127.0.0.1:9/v1")
    data["participants"][0]["id"] = bad
    with pytest.raises(ConfigError) as err:
        parse_config(data, "c.yaml")
    message = str(err.value)
    assert f"participant id {bad!r} is not allowed" in message and "e.g. Ana, Ben_2" in message
    assert "String should match pattern" not in message and "^[A-Za-z]" not in message


def test_a_code_reply_is_held_to_max_tokens(tmp_path: Path) -> None:
    from spasm.backends.base import Completion
    from spasm.backends.python import held_to
    from spasm.tokens import count_tokens

    huge = Completion(text="word " * 2_000_000, prompt_tokens=0, completion_tokens=26,
                      resolved_model="bot")
    held = held_to(huge, 40)
    assert held.finish_reason == "length" and count_tokens(held.text) <= 40
    assert held.completion_tokens == count_tokens(held.text) and len(held.text) > 100
    short = Completion(text="Hello there.", prompt_tokens=0, completion_tokens=0, resolved_model="bot")
    assert held_to(short, 40) is short
    one_long_token = Completion(text="x" * 10_000, prompt_tokens=0, completion_tokens=0,
                                resolved_model="bot")
    assert count_tokens(held_to(one_long_token, 40).text) <= 40


def test_a_run_stores_a_code_reply_cut_to_max_tokens(server: TestServer, tmp_path: Path) -> None:
    from spasm.tokens import count_tokens

    (tmp_path / "flood.py").write_text("def respond(messages, context):\n"
                                       "    return {'text': 'word ' * 2_000_000, 'completion_tokens': 26}\n")
    data = endpoint_config(server.base_url, personas={"n": 1})
    data["backends"]["bot"] = {"kind": "python", "target": f"{tmp_path / 'flood.py'}:respond"}
    data["pairings"] = [{"client": "srv", "responder": "bot"}]
    cfg = _write(tmp_path, data)
    assert main(["generate", "--config", str(cfg), "--out", str(tmp_path / "run"),
                 "--no-progress"]) == 0
    turns = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    bot = turns[turns.speaker == "responder"]
    assert len(bot) and all(count_tokens(t) <= 40 for t in bot.text)  # dialogue.max_tokens


def test_status_of_a_damaged_run_exits_1_and_a_killed_run_is_not_shown_running(
    runs: tuple[Path, Path], capsys: Any
) -> None:
    a, b = runs
    part = sorted((a / "turns.parquet").glob("*.parquet"))[0]
    part.write_bytes(part.read_bytes()[:-40])  # a truncated part
    capsys.readouterr()
    assert main(["status", str(a)]) == 1
    assert "DAMAGED:" in capsys.readouterr().out
    # A run whose manifest says running while no process holds its lock was killed.
    manifest = json.loads((b / "manifest.json").read_text())
    (b / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    assert main(["status", str(b)]) == 0
    out = capsys.readouterr().out
    assert "status:       interrupted (the manifest says running, but no process" in out
    assert "status:       running" not in out


def test_a_card_with_control_characters_is_printed_escaped(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a\x1b[31m1", "card": "You are Ana.\x00\x1b[2J\r Hi"}) + "\n")
    assert main(["personas", "--from", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x00" not in out and "\x1b" not in out and "\r" not in out
    assert "You are Ana.\\x00\\x1b[2J\\r Hi" in out and "a\\x1b[31m1" in out
    from spasm.redact import terminal_safe

    assert terminal_safe("line one\nline\ttwo\x07", keep="\n\t") == "line one\nline\ttwo\\x07"


def test_two_evaluations_at_once_distil_the_static_table_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tokenizers")
    import threading

    import numpy as np

    from spasm.evaluation import embeddings

    calls: list[int] = []
    inside = threading.Event()

    def distill(model: Any, tokenizer: Any, *, pca_dims: int, **_: Any) -> Any:
        # Stands in for the ~20 s model run (the lock is what is tested): slow enough that the
        # second evaluation arrives while the first is distilling.
        calls.append(1)
        inside.set()
        threading.Event().wait(1.0)
        size = embeddings._plain_tokenizer(tokenizer).get_vocab_size(with_added_tokens=True)
        return np.full((size, pca_dims), 0.5, dtype=np.float32)

    monkeypatch.setattr(embeddings.static, "distill_static_table", distill)
    made = [embeddings.StaticEmbedder(cache_dir=tmp_path / "static") for _ in range(2)]
    first = threading.Thread(target=made[0].embed, args=(["a text"],))
    first.start()
    assert inside.wait(60)
    second = threading.Thread(target=made[1].embed, args=(["a text"],))
    second.start()
    first.join(60)
    second.join(60)
    assert len(calls) == 1 and [e.distilled for e in made] == [True, False]
    np.testing.assert_array_equal(made[0].embed(["x"]), made[1].embed(["x"]))


# -- the embedded model's replies depend on the prompt alone, never on the schedule ---------------
def _sampled_loop(backend: Any, prefix: str, utterances: int = 6) -> list[str]:
    """A two-agent ECP dialogue sampled at temperature 0.7 (as runs are), replies as stored."""
    from spasm.agents import clean_reply, client_system_prompt, responder_system_prompt
    from spasm.backends.base import ChatRequest
    from spasm.history import History, Speaker
    from spasm.projection import Viewer, project

    card = "You are Sam, 41, a plumber. Your parcel is two weeks late and you want a refund."
    role = "customer-service agent"
    viewers: dict[Speaker, Viewer] = {"client": Viewer("client", client_system_prompt(card, role)),
                                      "responder": Viewer("responder", responder_system_prompt(role))}

    async def run() -> list[str]:
        history = History()
        for k in range(utterances):
            speaker: Speaker = "client" if k % 2 == 0 else "responder"
            c = await backend.complete(ChatRequest(
                messages=tuple(project(history, viewers[speaker], "ecp")), temperature=0.7,
                max_tokens=32, seed=100 + k, stream_key=f"{prefix}:{speaker}"))
            history = history.append(speaker, clean_reply(c.text, c.finish_reason == "length") or "ok")
        return [u.content for u in history]

    return anyio.run(run)


@pytest.mark.e2e
@pytest.mark.slow
def test_an_embedded_reply_is_the_same_from_a_kept_context_and_from_a_fresh_one() -> None:
    pytest.importorskip("llama_cpp")
    from spasm.backends.embedded import MIN_EVALUATED, EmbeddedBackend, SavedStates, StreamSlots
    from spasm.config import BackendConfig

    cfg = BackendConfig(kind="embedded", n_ctx=2048, n_threads=1)
    kept = EmbeddedBackend("embedded", cfg)  # each agent keeps its context: only new tokens
    fresh = EmbeddedBackend("embedded", cfg)
    fresh.slots, fresh.states = StreamSlots(1), SavedStates(0)  # every call from nothing
    assert _sampled_loop(kept, "kept") == _sampled_loop(fresh, "fresh")
    assert kept.stats["cached_tokens"] > 0 and fresh.stats["cached_tokens"] < kept.stats["cached_tokens"]
    # What makes it so: the context holds the prompt, never the reply's decoded tokens, and a
    # call evaluates at least two prompt tokens itself (a batch of one is computed differently).
    from spasm.backends.base import ChatRequest

    request = ChatRequest(messages=({"role": "system", "content": "You are brief."},
                                    {"role": "user", "content": "Say hello."}),
                          temperature=0.0, max_tokens=8, seed=1, stream_key="again")
    first = anyio.run(kept.complete, request)
    second = anyio.run(kept.complete, request)
    assert first.cached_tokens == 0 and second.text == first.text
    assert second.cached_tokens == second.prompt_tokens - MIN_EVALUATED
    assert kept._llm(kept.slots.slot("again")).n_tokens == second.prompt_tokens


@pytest.mark.e2e
@pytest.mark.slow
def test_the_same_embedded_plan_run_in_another_lane_order_gives_the_same_dialogues(
    tmp_path: Path
) -> None:
    pytest.importorskip("llama_cpp")
    from spasm.backends.embedded import EmbeddedBackend, SavedStates, StreamSlots

    data = {"name": "order", "seed": 3, "personas": {"n": 3}, "conditions": ["ecp"],
            "backends": {"embedded": {"kind": "embedded", "n_ctx": 2048}},
            "pairings": [{"client": "embedded", "responder": "embedded"}],
            "dialogue": {"max_turns_per_agent": 2, "max_tokens": 24},
            "termination": {"rules": True, "min_utterances": 4}}
    config = parse_config(data, "<test>")
    # As planned: the lanes the machine has, one dialogue each, contexts kept.
    anyio.run(Engine(config, tmp_path / "a", progress=False).run)
    # Last dialogue first, then the others, on one context with nothing saved: every call
    # starts from nothing, after another dialogue's calls.
    squeezed = EmbeddedBackend("embedded", config.backends["embedded"])
    squeezed.slots, squeezed.states = StreamSlots(1), SavedStates(0)
    engine = Engine(config, tmp_path / "b", progress=False, backends={"embedded": squeezed})
    planned = sorted(pd.read_parquet(tmp_path / "a" / "dialogues.parquet").dialogue_id)
    anyio.run(lambda: engine.run(only={planned[-1]}))
    anyio.run(Engine(config, tmp_path / "b", progress=False, backends={"embedded": squeezed}).run)

    def turns(run: Path) -> list[tuple[str, int, str]]:
        t = pd.read_parquet(run / "turns.parquet")
        return sorted(zip(t.dialogue_id, t.turn_index.astype(int), t.text, strict=True))

    assert len(planned) == 3 and turns(tmp_path / "a") == turns(tmp_path / "b")


def test_the_paired_drift_table_of_a_three_condition_run_says_it_compares_two() -> None:
    from spasm.evaluation.metrics import ConditionSummary, DriftMetrics

    def drift(*conditions: str) -> DriftMetrics:
        return DriftMetrics.model_construct(
            by_condition=[ConditionSummary.model_construct(condition=c) for c in conditions])

    assert drift("concat", "ecp").comparison_title() == "ECP vs CONCAT"
    title = drift("quoted", "ecp", "concat").comparison_title()
    assert title.startswith("ECP vs CONCAT only (2 of the run's 3 conditions: ecp, concat, quoted")
    assert "against the baseline" in title


# -- what the export's card says LLaMA-Factory and OpenAI will do is what they do ----------------
@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.test_qa import generate_run

    return generate_run(tmp_path_factory.mktemp("small") / "run", plant=True, personas=2)


def test_ending_keep_for_the_client_says_every_example_ends_on_a_user_turn(
    small_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "kept"
    assert main(["export", str(small_run), "--out", str(out), "--split", "1", "--role", "client",
                 "--ending", "keep", "--allow-qa", "ai_identity,prompt_leak"]) == 0
    rows = [json.loads(x) for x in (out / "openai" / "train.jsonl").read_text().splitlines()]
    assert rows and all(r["messages"][-1]["role"] == "user" for r in rows)
    card = json.loads((out / "card.json").read_text())
    assert card["user_endings"] == card["examples"] == len(rows)
    text = (out / "README.md").read_text()
    assert "every example ends on a `user` message" in text and "fails" in text
    assert "some end" not in text
    # The default ending records no such count in card.json.
    trimmed = tmp_path / "trimmed"
    assert main(["export", str(small_run), "--out", str(trimmed), "--split", "1", "--role", "client",
                 "--allow-qa", "ai_identity,prompt_leak"]) == 0
    assert "user_endings" not in json.loads((trimmed / "card.json").read_text())


def test_weights_without_sharegpt_offer_llamafactory_nothing_and_say_why(
    small_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "weighted"
    assert main(["export", str(small_run), "--out", str(out), "--split", "1", "--weights",
                 "--format", "openai,hf", "--allow-qa", "ai_identity,prompt_leak"]) == 0
    assert not (out / "dataset_info.json").exists()
    text = (out / "README.md").read_text()
    assert "no `dataset_info.json`: LLaMA-Factory reads no per-message `weight`" in text


def test_a_split_under_openais_minimum_of_10_examples_is_warned(
    small_run: Path, tmp_path: Path, capsys: Any
) -> None:
    assert main(["export", str(small_run), "--out", str(tmp_path / "few"), "--split", "1",
                 "--allow-qa", "ai_identity,prompt_leak"]) == 0
    err = capsys.readouterr().err
    assert "the train split has 4 examples, fewer than the 10 OpenAI's fine-tuning requires" in err

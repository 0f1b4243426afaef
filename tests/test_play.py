"""`spasm play`: a person takes a seat, through a pseudo-terminal and through a pipe, against
the OpenAI-compatible test server over real HTTP; the run it leaves is read back from Parquet."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from spasm.cli import main
from spasm.dataset import open_run
from tests.conftest import endpoint_config

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    # PYTHONFAULTHANDLER: a session that does not end is sent SIGABRT and prints every
    # thread's stack, so a hang is a failure that says where it was.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm", "PYTHONFAULTHANDLER": "1"}
    env.pop("SPASM_REAL_API", None)
    return env


def _config(tmp_path: Path, base_url: str, **overrides: Any) -> Path:
    path = tmp_path / "play.yaml"
    path.write_text(json.dumps(endpoint_config(base_url, **overrides)), encoding="utf-8")
    return path


def _pipe(cfg: Path, out: Path, lines: list[str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spasm", "play", "--config", str(cfg), "--out", str(out), *flags],
        input="".join(f"{line}\n" for line in lines), capture_output=True, text=True,
        timeout=300, env=_env(), cwd=ROOT)


def _read(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    run = open_run(out)
    (dialogue,) = run.table("dialogues").to_pylist()
    turns = sorted(run.table("turns").to_pylist(), key=lambda t: t["turn_index"])
    return dialogue, turns, run.table("calls").to_pylist()


@pytest.mark.e2e
def test_a_person_on_a_pipe_plays_the_client_seat_until_the_chain_ends_it(tmp_path: Path,
                                                                          server: Any) -> None:
    lines = ["Hi, my internet bill doubled this month.", "I was charged for a router I returned.",
             "Can you refund the router fee?", "Thanks, that settles it."]
    done = _pipe(_config(tmp_path, server.base_url), tmp_path / "run",
                 [*lines, "6", "5"], "--seat", "client")
    assert done.returncode == 0, done.stderr
    # The person saw the seat's frame (the persona card) and the responder's replies.
    assert "Your part" in done.stdout and "You are " in done.stdout
    assert done.stdout.count("Responder:") == 4
    assert "(one of 1, 2, 3, 4, 5" in done.stdout  # "6" was refused, "5" taken
    dialogue, turns, calls = _read(tmp_path / "run")
    assert dialogue["termination_reason"] == "max_turns" and dialogue["n_utterances"] == 8
    assert dialogue["client_kind"] == "human" and dialogue["responder_kind"] == "llm"
    assert re.fullmatch(r"op-[0-9a-f]{6}", dialogue["operator"])
    assert dialogue["interface"] == "terminal" and dialogue["pairing"] == "human×m"
    assert dialogue["person_rating"] == 5 and dialogue["person_goal_met"] is None
    assert [t["text"] for t in turns if t["speaker"] == "client"] == lines
    assert all(t["typing_ms"] is not None and t["typing_ms"] >= 0 and t["edits"] is None
               and t["pasted_chars"] is None for t in turns if t["speaker"] == "client")
    assert all(t["typing_ms"] is None for t in turns if t["speaker"] == "responder")
    # Every person's turn is a call of the human backend, never cached; the model's are HTTP.
    human = [c for c in calls if c["backend"] == "human"]
    assert len(human) == 4 and not any(c["cache_hit"] for c in human)
    assert {c["backend"] for c in calls if c["role"] != "client"} == {"srv"}
    assert open_run(tmp_path / "run").manifest["status"] == "complete"
    # The stored columns: the 1.10 human-seat columns after the table's own.
    names = pq.read_schema(next((tmp_path / "run" / "turns.parquet").glob("*.parquet"))).names
    assert names[-3:] == ["typing_ms", "edits", "pasted_chars"]


@pytest.mark.e2e
def test_the_person_can_take_the_responder_seat_and_end_it_with_slash_end(tmp_path: Path,
                                                                         server: Any) -> None:
    done = _pipe(_config(tmp_path, server.base_url), tmp_path / "run",
                 ["Hello, I can help with that. What happened?", "/end", "3"],
                 "--seat", "responder", "--operator", "tester-1", "--persona", "1")
    assert done.returncode == 0, done.stderr
    assert "Client:" in done.stdout
    dialogue, turns, _ = _read(tmp_path / "run")
    assert dialogue["termination_reason"] == "ended_by_person"
    assert dialogue["termination_detail"] == "the person typed /end"
    assert dialogue["responder_kind"] == "human" and dialogue["client_kind"] == "llm"
    assert dialogue["operator"] == "tester-1" and dialogue["pairing"] == "m×human"
    assert dialogue["person_rating"] == 3
    assert dialogue["persona_id"].startswith("p0001")  # --persona 1: the second persona
    # The simulated client opened, the person answered, the client replied, then /end.
    assert [t["speaker"] for t in turns] == ["client", "responder", "client"]
    assert turns[1]["text"] == "Hello, I can help with that. What happened?"


@pytest.mark.e2e
def test_markup_and_a_megabyte_paste_are_kept_as_typed(tmp_path: Path, server: Any) -> None:
    markup = "<script>alert('x')</script> <b>bold</b> & {{ not a template }}"
    big = "word " * 200_000  # a 1 MB line
    done = _pipe(_config(tmp_path, server.base_url), tmp_path / "run",
                 [markup, big.strip()], "--seat", "client")
    assert done.returncode == 0, done.stderr
    _, turns, _ = _read(tmp_path / "run")
    mine = [t["text"] for t in turns if t["speaker"] == "client"]
    assert mine == [markup, big.strip()]
    # End of input after the second line: the dialogue is kept as it stands.
    dialogue, _, _ = _read(tmp_path / "run")
    assert dialogue["termination_reason"] == "ended_by_person"
    assert "Ctrl-D" in dialogue["termination_detail"]


@pytest.mark.e2e
def test_a_scenario_session_asks_the_person_whether_the_goal_was_met(tmp_path: Path,
                                                                     server: Any) -> None:
    scenario = {"id": "refund", "situation": "You were charged twice for one order.",
                "goal": "Get the duplicate charge refunded.",
                "expected_outcome": "The agent starts a refund of the second charge."}
    cfg = _config(tmp_path, server.base_url, scenarios=[scenario])
    done = _pipe(cfg, tmp_path / "run", ["I was charged twice.", "/end", "y", "4"],
                 "--seat", "client", "--scenario", "refund")
    assert done.returncode == 0, done.stderr
    assert "Get the duplicate charge refunded." in done.stdout  # on the card and in the question
    dialogue, _, calls = _read(tmp_path / "run")
    assert dialogue["scenario_id"] == "refund"
    assert dialogue["person_goal_met"] is True and dialogue["person_rating"] == 4
    # The goal judge asked the model, never the person.
    assert {c["backend"] for c in calls if c["role"] == "goal_judge"} == {"srv"}


def test_spasm_generate_refuses_a_config_with_a_human_seat(tmp_path: Path, server: Any,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    data = endpoint_config(server.base_url)
    data["backends"]["me"] = {"kind": "human", "operator": "op-000001"}
    data["pairings"] = [{"client": "me", "responder": "srv"}]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(data), encoding="utf-8")
    assert main(["generate", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 2
    assert "spasm play" in capsys.readouterr().err
    assert not (tmp_path / "run" / "dialogues.parquet").exists()


def test_an_unknown_seat_or_persona_is_a_usage_error(tmp_path: Path, server: Any,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, server.base_url)
    assert main(["play", "--config", str(cfg), "--seat", "judge", "--out", str(tmp_path / "a")]) == 2
    assert "client and responder" in capsys.readouterr().err
    assert main(["play", "--config", str(cfg), "--seat", "client", "--persona", "p9",
                 "--out", str(tmp_path / "b")]) == 2
    assert "names no persona" in capsys.readouterr().err


# -- a pseudo-terminal: readline, Ctrl-C and Ctrl-D as a person types them ----------------------
def _expect(fd: int, text: str, seen: bytearray, count: int = 1, limit_s: float = 120.0) -> None:
    """Read the terminal until ``text`` has appeared ``count`` times (``limit_s``: only a guard
    against a hang, never a measurement)."""
    deadline = time.monotonic() + limit_s
    while seen.count(text.encode()) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never appeared; the terminal shows:\n"
                                 f"{seen.decode(errors='replace')}")
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                chunk = b""
            if not chunk:
                raise AssertionError(f"the session ended before {text!r}:\n"
                                     f"{seen.decode(errors='replace')}")
            seen.extend(chunk)


def _waiting_for_a_key(pid: int, limit_s: float = 60.0) -> None:
    """Wait until the session's main thread sleeps with SIGINT deliverable, i.e. in readline's
    select(). A Ctrl-C that lands after readline drew the prompt but before that select() only
    marks Python's handler as due, and CPython's readline runs due handlers only when its
    select() is interrupted: the read sleeps on until a second Ctrl-C. A person seldom types
    inside that window (microseconds after each redraw); a test that answers the prompt the
    moment it appears hits it on a loaded machine (7 sessions in 25 here, before this wait)."""
    status = Path(f"/proc/{pid}/task/{pid}/status")
    sigint = 1 << (signal.SIGINT - 1)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        if fields["State"].strip().startswith("S") and not int(fields["SigBlk"], 16) & sigint:
            return
        time.sleep(0.01)
    raise AssertionError("the session never waited for a key")


def _spawn(args: list[str]) -> tuple[int, int]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal, so ^C is a SIGINT
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "spasm", *args], _env())
    return pid, fd


def _drain(fd: int, seen: bytearray, limit_s: float) -> bool:
    """Read the terminal until the child closes it (True) or ``limit_s`` passes (False)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return True
            if not chunk:
                return True
            seen.extend(chunk)
    return False


def _finish(pid: int, fd: int, seen: bytearray) -> int:
    """The session's exit code once it has ended; a session still running a minute after the
    last key is sent SIGABRT (its faulthandler prints every thread's stack) and fails the test."""
    closed = _drain(fd, seen, 60)
    deadline = time.monotonic() + 30
    while closed and time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            os.close(fd)
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGABRT)
    _drain(fd, seen, 10)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(fd)
    raise AssertionError(f"the session did not end; the terminal shows:\n"
                         f"{seen.decode(errors='replace')}")


@pytest.mark.e2e
@pytest.mark.parametrize(("key", "how"), [(b"\x03", "Ctrl-C"), (b"\x04", "Ctrl-D")])
def test_in_a_terminal_ctrl_c_or_ctrl_d_saves_what_was_said(tmp_path: Path, server: Any,
                                                            key: bytes, how: str) -> None:
    cfg = _config(tmp_path, server.base_url)
    pid, fd = _spawn(["play", "--config", str(cfg), "--seat", "client", "--out", str(tmp_path / "run")])
    seen = bytearray()
    _expect(fd, "Your part", seen)
    _expect(fd, "you> ", seen)
    os.write(fd, b"My parcel never arrived\x7f\x7f\x7f\x7f\x7f\x7f\x7farrived, it is a week late.\r")
    _expect(fd, "Responder:", seen)
    _expect(fd, "you> ", seen, count=2)
    _waiting_for_a_key(pid)
    os.write(fd, key)
    code = _finish(pid, fd, seen)
    assert code == 0, seen.decode(errors="replace")
    assert b"Saved:" in seen
    dialogue, turns, _ = _read(tmp_path / "run")
    assert dialogue["termination_reason"] == "ended_by_person" and how in dialogue["termination_detail"]
    # readline edited the line (the backspaces): the stored text is what was finally entered.
    assert [t["speaker"] for t in turns] == ["client", "responder"]
    assert turns[0]["text"] == "My parcel never arrived, it is a week late."
    assert turns[0]["typing_ms"] is not None


def test_a_ctrl_c_that_wakes_no_read_still_ends_the_prompt() -> None:
    """A SIGINT the kernel hands to another thread (or one that lands just before the read
    starts) only marks the handler as due: the relay wakes the prompt's read, and the turn ends
    as a Ctrl-C ends it. Without the relay the read sleeps until the guard feeds it a line."""
    from spasm.errors import ParticipantLeft
    from spasm.play.terminal import TerminalPerson

    r, w = os.pipe()
    person = TerminalPerson(stdin=os.fdopen(r, "r"), stdout=io.StringIO())
    fed = threading.Event()

    def other_thread() -> None:
        deadline = time.monotonic() + 30
        while not person._reading and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # this thread takes it
        if not done.wait(10):  # only a guard against a hang, never a measurement
            fed.set()
            os.write(w, b"a line typed much later\n")

    done = threading.Event()
    with person.signals():
        taker = threading.Thread(target=other_thread)
        taker.start()
        try:
            with pytest.raises(ParticipantLeft, match=r"interrupted \(Ctrl-C\)"):
                person._read()
        finally:
            done.set()
            taker.join()
    os.close(w)
    assert not fed.is_set(), "the read ended only when the guard fed it a line"
    assert person.ended_by_person


@pytest.mark.e2e
def test_export_leaves_human_dialogues_out_unless_include_human(tmp_path: Path, server: Any,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["Hi, my internet bill doubled this month.", "I was charged for a router I returned.",
             "Can you refund the router fee?", "Thanks, that settles it."]
    run = tmp_path / "run"
    done = _pipe(_config(tmp_path, server.base_url), run, [*lines, ""], "--seat", "client")
    assert done.returncode == 0, done.stderr
    assert main(["export", str(run), "--out", str(tmp_path / "none")]) == 2
    assert "human 1" in capsys.readouterr().err
    assert main(["export", str(run), "--out", str(tmp_path / "kept"), "--include-human"]) == 0
    card = (tmp_path / "kept" / "README.md").read_text(encoding="utf-8")
    assert "1 of the conversations have a person in a seat" in card
    assert json.loads((tmp_path / "kept" / "card.json").read_text())["human_conversations"] == 1


@pytest.mark.e2e
def test_a_ctrl_c_while_the_other_side_answers_ends_at_the_persons_next_turn(tmp_path: Path) -> None:
    from spasm.testing import FaultPlan, TestServer

    with TestServer(FaultPlan(latency_s=3.0, seed=1)) as slow:
        cfg = _config(tmp_path, slow.base_url)
        pid, fd = _spawn(["play", "--config", str(cfg), "--seat", "client", "--out", str(tmp_path / "run")])
        seen = bytearray()
        _expect(fd, "you> ", seen)
        os.write(fd, b"Hello, my order is missing.\r")
        _expect(fd, "is typing...", seen)
        os.write(fd, b"\x03")  # while the responder's reply is on its way
        _expect(fd, "ends at your next turn", seen)
        code = _finish(pid, fd, seen)
    assert code == 0, seen.decode(errors="replace")
    dialogue, turns, _ = _read(tmp_path / "run")
    # The reply that was on its way is kept; the dialogue ends where the person would speak.
    assert dialogue["termination_reason"] == "ended_by_person" and "Ctrl-C" in dialogue["termination_detail"]
    assert [t["speaker"] for t in turns] == ["client", "responder"]


@pytest.mark.e2e
def test_a_person_takes_a_seat_of_a_group(tmp_path: Path, server: Any) -> None:
    from tests.test_group import _group_data

    data = _group_data(server.base_url)
    data["conditions"] = ["ecp"]
    cfg = tmp_path / "group.yaml"
    cfg.write_text(json.dumps(data), encoding="utf-8")
    done = _pipe(cfg, tmp_path / "run", ["Hi all, I am Ben.", "I agree with Ana.", "/end", ""],
                 "--seat", "Ben")
    assert done.returncode == 0, done.stderr
    run = open_run(tmp_path / "run")
    seats = {p["participant_id"]: p for p in run.table("participants").to_pylist()}
    assert seats["Ben"]["kind"] == "human" and seats["Ben"]["interface"] == "terminal"
    assert re.fullmatch(r"op-[0-9a-f]{6}", seats["Ben"]["operator"])
    assert {seats[s]["kind"] for s in ("Ana", "Carla", "Facilitator")} == {"llm"}
    assert seats["Ana"]["operator"] is None and seats["Ben"]["backend"] == "human"
    (dialogue,) = run.table("dialogues").to_pylist()
    assert dialogue["termination_reason"] == "max_utterances"  # 8: Ben spoke twice
    assert dialogue["operator"] == seats["Ben"]["operator"]
    ben = [t for t in run.table("turns").to_pylist() if t["speaker"] == "Ben"]
    assert [t["text"] for t in sorted(ben, key=lambda t: t["turn_index"])] == ["Hi all, I am Ben.",
                                                                             "I agree with Ana."]
    assert all(t["typing_ms"] is not None for t in ben)


@pytest.mark.e2e
def test_rerunning_an_interrupted_session_resumes_it_with_the_same_pseudonym(tmp_path: Path,
                                                                            server: Any) -> None:
    cfg = _config(tmp_path, server.base_url)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "spasm", "play", "--config", str(cfg), "--seat",
                             "client", "--out", str(run)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=ROOT)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"My first line.\n")
    proc.stdin.flush()
    for line in proc.stdout:  # until the reply is on screen (or the session ended)
        if b"Responder:" in line:
            break
    proc.kill()  # a crash mid-session: nothing was committed
    proc.wait()
    first = json.loads((run / "config.json").read_text())["config"]["backends"]["human"]["operator"]
    done = _pipe(cfg, run, ["My first line.", "/end", ""], "--seat", "client")
    assert done.returncode == 0, done.stderr
    dialogue, turns, calls = _read(run)
    assert dialogue["operator"] == first
    assert [t["text"] for t in turns if t["speaker"] == "client"] == ["My first line."]
    assert any(c["cache_hit"] for c in calls if c["backend"] == "srv")  # the reply, replayed


@pytest.mark.e2e
def test_a_harnessed_partner_and_an_audit_never_ask_the_person(tmp_path: Path, server: Any) -> None:
    cfg = _config(tmp_path, server.base_url, harness={"responder": "C", "audit": True})
    done = _pipe(cfg, tmp_path / "run", ["Hello, I need help.", "It is about my bill.", "/end", ""],
                 "--seat", "client")
    assert done.returncode == 0, done.stderr
    dialogue, _, calls = _read(tmp_path / "run")
    assert dialogue["harness_level"] == "A/C"  # the person at A, the partner at its level
    assert {c["role"] for c in calls if c["backend"] == "human"} == {"client"}
    assert {"audit", "reducer"} <= {c["role"] for c in calls if c["backend"] == "srv"}


@pytest.mark.e2e
def test_under_quoted_the_person_is_shown_the_transcript_the_seat_is_sent(tmp_path: Path,
                                                                         server: Any) -> None:
    done = _pipe(_config(tmp_path, server.base_url), tmp_path / "run",
                 ["Hello there.", "My bill is wrong.", "/end", ""],
                 "--seat", "responder", "--condition", "quoted")
    assert done.returncode == 0, done.stderr
    assert "(what your seat is sent):" in done.stdout and "> You: Hello there." in done.stdout
    dialogue, turns, _ = _read(tmp_path / "run")
    assert dialogue["condition"] == "quoted"
    assert [t["text"] for t in turns if t["speaker"] == "responder"] == ["Hello there.",
                                                                         "My bill is wrong."]


def test_a_run_written_in_one_step_keeps_who_filled_each_seat(tmp_path: Path) -> None:
    """An import of people's conversations (spasm import, later) writes the 1.10 columns
    through write_finished_run; a run without them keeps its columns."""
    from spasm.dataset.store import write_finished_run

    def dialogue(did: str, **human: Any) -> dict[str, Any]:
        return {"dialogue_id": did, "persona_id": "p0", "conversation_index": 0, "condition": "ecp",
                "pairing": "human×m", "client_backend": "people", "client_model": "human",
                "responder_backend": "bot", "responder_model": "m", "seed": 0, "n_utterances": 2,
                "termination_reason": "imported", **human}

    turns = [{"dialogue_id": "d0", "turn_index": 0, "speaker": "client", "text": "hi"},
             {"dialogue_id": "d0", "turn_index": 1, "speaker": "responder", "text": "hello"}]
    persona = {"persona_id": "p0", "persona_index": 0, "card": "A person."}
    write_finished_run(tmp_path / "people", {
        "personas": [persona],
        "dialogues": [dialogue("d0", client_kind="human", responder_kind="llm", operator="src-17",
                               interface="import")],
        "turns": turns}, {"schema_version": "1.10"}, persona_fields=([], set()))
    (row,) = open_run(tmp_path / "people").table("dialogues").to_pylist()
    assert (row["client_kind"], row["operator"], row["interface"]) == ("human", "src-17", "import")
    write_finished_run(tmp_path / "models", {"personas": [persona], "dialogues": [dialogue("d0")],
                                             "turns": turns}, {"schema_version": "1.10"},
                       persona_fields=([], set()))
    stored = pq.read_schema(next((tmp_path / "models" / "dialogues.parquet").glob("*.parquet")))
    assert "client_kind" not in stored.names


def _play_in_process(cfg: Path, out: Path, first: bytes, *flags: str) -> tuple[int, Any]:
    """``spasm play`` in this process on a pipe that stays open: ``first`` is written, then
    nothing more (a person who says no more)."""
    from unittest import mock

    read, write = os.pipe()
    os.write(write, first)
    stdin = os.fdopen(read, "r", encoding="utf-8")
    try:
        with mock.patch.object(sys, "stdin", stdin):
            code = main(["play", "--config", str(cfg), "--seat", "client", "--out", str(out), *flags])
    finally:
        os.close(write)
        stdin.close()
    return code, stdin


def test_a_person_silent_past_the_idle_timeout_ends_the_dialogue_keeping_what_was_said(
        tmp_path: Path, server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A person who goes silent: without --idle-timeout the session waits as long
    as it takes, and says so; with one, the prompt that gets no line in time ends the dialogue
    there, saved like an /end (termination_reason person_silent). The first line is in the
    pipe at once; the second never comes, so the 1 s timeout ends it (not a measurement)."""
    out = tmp_path / "run"
    code, _ = _play_in_process(_config(tmp_path, server.base_url), out, b"Hello, my order is missing.\n",
                               "--idle-timeout", "1")
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "If you send no line for 1 s after a prompt" in printed
    assert "nothing typed for 1 s: the conversation ends here" in printed and "Saved:" in printed
    assert "How would you rate" not in printed  # a silent person is not asked the debrief
    dialogue, turns, _ = _read(out)
    assert dialogue["termination_reason"] == "person_silent"
    assert dialogue["termination_detail"] == "no line from the person for 1 s (--idle-timeout)"
    assert [(t["speaker"], t["text"]) for t in turns][:1] == [("client", "Hello, my order is missing.")]
    assert [t["speaker"] for t in turns] == ["client", "responder"]
    assert open_run(out).manifest["status"] == "complete"
    assert main(["play", "--config", str(tmp_path / "play.yaml"), "--seat", "client", "--out",
                 str(tmp_path / "x"), "--idle-timeout", "soon"]) == 2
    assert "--idle-timeout 'soon': give a positive duration" in capsys.readouterr().err


def test_what_a_person_types_is_counted_apart_from_the_model_tokens(
        tmp_path: Path, server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A person's turns are no model's output: their call rows carry no tokens, the
    run's token total and the dialogue's token columns are the models' alone, and the summary
    line and the manifest count the person's turns and the tokens of their text apart."""
    out = tmp_path / "run"
    code, _ = _play_in_process(_config(tmp_path, server.base_url), out,
                               b"Hi, my internet bill doubled.\nI was charged for a router I returned.\n"
                               b"/end\n\n")
    printed = capsys.readouterr().out
    assert code == 0, printed
    dialogue, turns, calls = _read(out)
    mine = [t for t in turns if t["speaker"] == "client"]
    typed = sum(t["n_tokens"] for t in mine)
    assert len(mine) == 2 and typed > 0  # the turn keeps its text's length
    human = [c for c in calls if c["backend"] == "human"]
    assert len(human) == 2 and all(c["prompt_tokens"] == c["completion_tokens"] == 0 for c in human)
    model_tokens = sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls)
    assert model_tokens > 0
    usage = open_run(out).manifest["usage"]
    assert usage["total_tokens"] == model_tokens
    assert (usage["typed_turns"], usage["typed_tokens"]) == (2, typed)
    assert dialogue["completion_tokens"] == sum(c["completion_tokens"] for c in calls
                                                if c["dialogue_id"] == dialogue["dialogue_id"])
    assert (f"{model_tokens:,} tokens; 2 turns typed by a person ({typed:,} tokens of text, "
            "not model tokens)") in printed

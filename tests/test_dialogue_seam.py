"""The dialogue knows only its seam: ``simulate_dialogue`` runs any two ``TurnAgent``\\ s it is
handed (here scripted ones that call no model), with the chain, the session and the hooks it is
given, and quarantines a bug with its full traceback."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pandas as pd
import pytest

from spasm.agents import NextPrompt, NoteColumns, PlainAgent, Turn, TurnAgent
from spasm.backends.base import Completion, Message
from spasm.calls import Caller
from spasm.config import parse_config
from spasm.dataset.rows import TurnRow
from spasm.engine import Engine
from spasm.history import History, Speaker
from spasm.session import DialogueSession
from spasm.simulation import simulate_dialogue
from spasm.termination import RuleDetector, TerminationChain
from spasm.testing import TestServer
from tests.conftest import endpoint_config


@dataclass(frozen=True)
class Notes:
    """A layer's own record (what a harness would add), stored through its columns."""

    verdict: str

    def columns(self) -> NoteColumns:
        return NoteColumns(checker_verdict=self.verdict, intent="scripted", harness_fallbacks=1)


@dataclass
class ScriptedAgent:
    """Says its lines in order; records what it saw; calls no model."""

    speaker: Speaker
    lines: list[str]
    backend: str = "none"
    system_prompt: str = "scripted"
    seen: list[int] = field(default_factory=list)
    set_up: int = 0

    async def setup(self, session: DialogueSession) -> None:
        self.set_up += 1

    async def turn(self, history: History, session: DialogueSession) -> Turn:
        self.seen.append(len(history))
        text = self.lines[len(self.seen) - 1]
        messages: list[Message] = [{"role": "user", "content": text}]
        return Turn(speaker=self.speaker, text=text, completion=Completion(text, 3, 2, "script"),
                    messages=messages, notes=Notes(f"ok {len(history)}"))

    def next_prompt(self, history: History, session: DialogueSession) -> NextPrompt:
        return NextPrompt([])


class Counter:
    """A hook after the dialogue that annotates the last turn."""

    def __init__(self) -> None:
        self.calls = 0

    async def after(self, agents: Sequence[TurnAgent], history: History, turns: list[TurnRow],
                    session: DialogueSession) -> None:
        self.calls += 1
        turns[-1].probe = f'{{"n": {len(history)}}}'


def _session() -> DialogueSession:
    return DialogueSession.open(Caller({}, {}), "d-1", "p-1", "ecp", seed=7)


def test_two_scripted_agents_talk_until_the_chain_stops_them() -> None:
    client = ScriptedAgent("client", ["Hi, I need help.", "Thanks, that helps. Goodbye!"])
    responder = ScriptedAgent("responder", ["Of course, tell me more.", "Take care, goodbye!"])
    hook = Counter()
    convo = anyio.run(lambda: simulate_dialogue(
        "d-1", [client, responder], TerminationChain([RuleDetector(window=2)], min_utterances=2),
        _session(), max_turns_per_agent=5, hooks=[hook],
    ))
    assert convo.error is None and convo.reason == "natural_rule"
    assert [u.content for u in convo.history] == [
        "Hi, I need help.", "Of course, tell me more.", "Thanks, that helps. Goodbye!",
        "Take care, goodbye!"]
    # Each agent was set up once and spoke after exactly the history before its turn.
    assert client.set_up == responder.set_up == 1
    assert client.seen == [0, 2] and responder.seen == [1, 3]
    rows = convo.turns
    assert [r.turn_index for r in rows] == [0, 1, 2, 3]
    assert [r.speaker for r in rows] == ["client", "responder", "client", "responder"]
    # The layer's record reaches the row through its columns only.
    assert rows[2].checker_verdict == "ok 2" and rows[2].intent == "scripted"
    assert all(r.harness_fallbacks == 1 and r.n_tokens == 2 and r.prompt_tokens == 3 for r in rows)
    assert hook.calls == 1 and rows[-1].probe == '{"n": 4}'


def test_the_cap_ends_a_dialogue_no_rule_stops() -> None:
    client = ScriptedAgent("client", ["a", "b", "c"])
    responder = ScriptedAgent("responder", ["x", "y", "z"])
    convo = anyio.run(lambda: simulate_dialogue(
        "d-1", [client, responder], TerminationChain([], min_utterances=2), _session(),
        max_turns_per_agent=3,
    ))
    assert convo.reason == "max_turns" and len(convo.turns) == 6 and convo.error is None


class Broken(ScriptedAgent):
    async def turn(self, history: History, session: DialogueSession) -> Turn:
        if len(history) >= 2:
            {}["missing"]  # a bug, not a RunError
        return await super().turn(history, session)


def test_a_bug_is_quarantined_with_its_traceback_and_the_dialogue_so_far() -> None:
    client = Broken("client", ["a", "b"])
    responder = ScriptedAgent("responder", ["x", "y"])
    convo = anyio.run(lambda: simulate_dialogue(
        "d-1", [client, responder], TerminationChain([], min_utterances=2), _session(),
        max_turns_per_agent=3,
    ))
    assert isinstance(convo.error, KeyError)
    assert convo.traceback is not None and "KeyError" in convo.traceback
    assert "test_dialogue_seam.py" in convo.traceback and "in turn" in convo.traceback
    assert len(convo.history) == 2 and len(convo.turns) == 2
    # The traceback is the real one, as Python formats it.
    assert convo.traceback.strip().splitlines()[-1] == "".join(
        traceback.format_exception_only(convo.error)).strip()
    assert sys.exc_info() == (None, None, None)


def test_a_run_whose_dialogues_all_hit_one_bug_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the engine on the test server: every dialogue's responder hits the same bug;
    each is quarantined with its traceback in errors.parquet, the traceback is printed once,
    and the run says they all failed on one bug (and fails)."""
    original = PlainAgent.turn

    async def buggy(self: PlainAgent, history: History, session: DialogueSession) -> Turn:
        if self.speaker == "responder":
            raise ZeroDivisionError("planted bug")
        return await original(self, history, session)

    monkeypatch.setattr(PlainAgent, "turn", buggy)
    with TestServer() as srv:
        config = parse_config(endpoint_config(srv.base_url, personas={"n": 3}), "<test>")
        summary = anyio.run(Engine(config, tmp_path / "run", progress=False).run)
    errors = pd.read_parquet(tmp_path / "run" / "errors.parquet")
    assert len(errors) == 3 and set(errors.error_type) == {"ZeroDivisionError"}
    assert all("planted bug" in tb and "in buggy" in tb for tb in errors.traceback)
    assert summary.completed == 0 and summary.failed is not None
    assert "all 3 dialogues of this pass failed on the same bug" in summary.failed
    err = capsys.readouterr().err
    assert err.count("Traceback (most recent call last)") == 1
    assert err.count("failed on the same bug: ZeroDivisionError: planted bug") == 2


def test_importing_the_history_loads_neither_the_engine_nor_the_llm_layer() -> None:
    """``spasm`` loads its public names on first use: a fresh interpreter that imports
    ``spasm.history`` holds a handful of spasm modules, not the engine."""
    import subprocess

    code = ("import sys, spasm.history; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('spasm'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert "spasm.history" in loaded and len(loaded) <= 5, loaded
    assert not {"spasm.engine", "spasm.calls", "spasm.dataset", "spasm.config"} & set(loaded)

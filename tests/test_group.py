"""Group dialogues: participants, a projection for each, who speaks next, and the
run on the test server with its tables read back, resumed after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest

from spasm.calls import Caller
from spasm.config import parse_config
from spasm.dataset import open_run
from spasm.engine import Engine
from spasm.errors import ConfigError
from spasm.history import History
from spasm.projection import group_viewer, project
from spasm.session import DialogueSession
from spasm.testing import FaultPlan, TestServer
from spasm.turn_order import (
    Choice,
    Seat,
    TurnOrderSetup,
    addressed_in,
    make_next_speaker,
    register_next_speaker,
)
from tests.conftest import endpoint_config
from tests.test_shards import sorted_rows

IDS = ("Ana", "Ben", "Carla", "Facilitator")
SEATS = tuple(Seat(i, "responder" if i == "Facilitator" else "client") for i in IDS)


def _history(n: int = 7) -> History:
    h = History()
    for k in range(n):
        h = h.append(IDS[k % len(IDS)], f"line {k} from {IDS[k % len(IDS)]}")
    return h


def _viewer(me: str, names: Any = "prefix") -> Any:
    return group_viewer(me, f"frame of {me}", IDS, speaker_names=names)


# -- projections ----------------------------------------------------------------------------
@pytest.mark.parametrize("names", ["prefix", "name_field"])
def test_ecp_every_turn_once_in_every_frame_as_assistant_only_in_its_speakers(names: str) -> None:
    """The mirror property generalised: in each participant's ECP frame every utterance
    appears exactly once, as an assistant message in its speaker's frame only, and another
    speaker's turn carries its id (prefix or name field); consecutive turns of others stay
    separate messages."""
    history = _history()
    for me in IDS:
        frame = project(history, _viewer(me, names), "ecp")
        assert frame[0] == {"role": "system", "content": f"frame of {me}"}
        body = frame[1:] if history[0].speaker != me else frame[2:]
        assert len(body) == len(history)
        for u, m in zip(history, body, strict=True):
            if u.speaker == me:
                assert m == {"role": "assistant", "content": u.content}
            elif names == "prefix":
                assert m == {"role": "user", "content": f"{u.speaker}: {u.content}"}
            else:
                assert m == {"role": "user", "content": u.content, "name": u.speaker}


def test_concat_and_quoted_frames_name_every_speaker() -> None:
    history = _history(5)
    for me in IDS:
        concat = project(history, _viewer(me), "concat")[1]["content"]
        for u in history:
            assert concat.count(f"{u.speaker}: {u.content}") == 1
        assert concat.endswith(f"Continue the conversation as {me}. Write only {me}'s next "
                               f"message, without the '{me}:' prefix.")
        quoted = project(history, _viewer(me), "quoted")[1]["content"]
        for u in history:
            label = "You" if u.speaker == me else u.speaker
            assert quoted.count(f"> {label}: {u.content}") == 1


def test_the_opener_gets_the_opening_instruction_and_the_others_do_not() -> None:
    history = _history(1)
    assert project(history, _viewer("Ana"), "ecp")[1]["role"] == "user"
    assert project(history, _viewer("Ana"), "ecp")[2]["role"] == "assistant"
    assert project(history, _viewer("Ben"), "ecp")[1:] == [
        {"role": "user", "content": f"Ana: {history[0].content}"}]


# -- who speaks next --------------------------------------------------------------------------
def _session(caller: Caller | None = None) -> DialogueSession:
    return DialogueSession.open(caller or Caller({}, {}), "g0000-ecp", "p0", "ecp", seed=11)


def _choose(policy: str, history: History, **kw: Any) -> Choice:
    order = make_next_speaker(policy, TurnOrderSetup(SEATS, **kw))
    return anyio.run(order.choose, history, _session())


def test_round_robin_follows_the_seats() -> None:
    h = History().append("Carla", "hello")
    assert _choose("round_robin", h) == Choice("Facilitator", "round robin")
    assert _choose("round_robin", h.append("Facilitator", "hi all")).speaker == "Ana"


def test_addressed_answers_whoever_was_named_last_else_round_robin() -> None:
    assert addressed_in("Ben, what do you think? And @carla?", IDS, "Ana") == "Carla"
    assert addressed_in("As I said, I am Ana.", IDS, "Ana") is None
    assert addressed_in("Benjamin is my brother", IDS, "Ana") is None  # a word, not a prefix
    h = History().append("Facilitator", "Ana, how was your week?")
    assert _choose("addressed", h) == Choice("Ana", "addressed by Facilitator")
    h = History().append("Ana", "It was fine.")
    assert _choose("addressed", h) == Choice("Ben", "nobody addressed: round robin")


def test_random_is_seeded_and_never_repeats_a_speaker_unless_allowed() -> None:
    ending_with_ben = [_history(k).append("Ben", "me again") for k in range(30)]
    picks = [_choose("random", h).speaker for h in ending_with_ben]
    assert "Ben" not in picks and len(set(picks)) == 3
    # The draw depends on the dialogue's seed and the position only: the same again.
    assert picks == [_choose("random", h).speaker for h in ending_with_ben]
    repeats = {_choose("random", _history(k), allow_repeat=True).speaker for k in range(1, 40)}
    assert repeats == set(IDS)


def test_the_moderator_picks_through_the_one_caller_and_falls_back_when_unusable() -> None:
    with TestServer() as srv:
        config = parse_config(endpoint_config(srv.base_url), "<test>")
        from spasm.runplan import make_backends

        caller = Caller(make_backends(config), config.backends, sleep_scale=0.0)
        session = _session(caller)
        order = make_next_speaker("llm", TurnOrderSetup(SEATS, moderator_backend="srv"))
        choice = anyio.run(order.choose, History().append("Ana", "hello everyone"), session)
    # The schema only allows the other participants' ids: the test server answers with one.
    assert choice.speaker in {"Ben", "Carla", "Facilitator"}
    assert choice.reason.startswith("moderator: ")
    rows = session.scope.records
    assert [r.role for r in rows] == ["moderator"] and rows[0].outcome == "ok"
    assert json.loads(rows[0].params)["structured"] is True
    with pytest.raises(ConfigError, match="moderator_backend"):
        make_next_speaker("llm", TurnOrderSetup(SEATS))


def test_a_plugged_in_policy_is_used_by_name() -> None:
    @register_next_speaker("always-facilitator-test")
    class Facilitated:
        def __init__(self, setup: TurnOrderSetup) -> None:
            self.setup = setup

        async def choose(self, history: History, session: DialogueSession) -> Choice:
            last = history[len(history) - 1].speaker
            return Choice("Ana" if last == "Facilitator" else "Facilitator", "plugin")

    try:
        assert _choose("always-facilitator-test", _history(2)).speaker == "Facilitator"
    finally:
        from spasm.registry import NEXT_SPEAKERS

        NEXT_SPEAKERS.unregister("always-facilitator-test")


# -- config -----------------------------------------------------------------------------------
def _group_data(base_url: str, **group: Any) -> dict[str, Any]:
    data = endpoint_config(
        base_url, personas={"n": 6}, conditions=["ecp", "concat"],
        participants=[
            {"id": "Ana", "role": "client", "backend": "srv"},
            {"id": "Ben", "role": "client", "backend": "srv"},
            {"id": "Carla", "role": "client", "backend": "srv"},
            {"id": "Facilitator", "role": "responder", "backend": "srv",
             "responder_role": "peer-support facilitator"},
        ],
        group={"max_utterances": 8, **group},
    )
    data.pop("pairings")
    return data


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(participants=d["participants"][:1]), "at least two participants"),
    (lambda d: d.update(participants=[p for p in d["participants"] if p["role"] == "client"]),
     "one responder seat"),
    (lambda d: d["participants"][1].update(id="ana"), "ids repeat"),
    (lambda d: d["participants"][1].update(id="Ben Smith"), "participants"),
    (lambda d: d["participants"][3].update(id="Responder"), r"\['Responder'\] would read as a role"),
    (lambda d: d["participants"][0].update(id="you"), "would read as a role or a chat label"),
    (lambda d: d["participants"][1].update(backend="nope"), "names backend 'nope'"),
    (lambda d: d["group"].update(opener="Zoe"), "group.opener 'Zoe'"),
    (lambda d: d["group"].update(next_speaker="loudest"), "unknown next-speaker policy"),
    (lambda d: d.update(pairings=[{"client": "srv", "responder": "srv"}]), "replaces pairings"),
    (lambda d: d.update(harness={"levels": ["A", "E"]}), r"participants\[\]\.level"),
    (lambda d: d.update(harness={"recall_probe": True}), "recall probes ask about one partner"),
])
def test_bad_group_configs_are_clear_errors(change: Any, message: str) -> None:
    data = _group_data("http://127.0.0.1:9/v1")
    change(data)
    with pytest.raises(ConfigError, match=message):
        parse_config(data, "<test>")


def test_a_two_party_config_keeps_its_fingerprint() -> None:
    data = endpoint_config("http://127.0.0.1:9/v1")
    assert parse_config(data, "<t>").fingerprint() == parse_config(
        {**data, "group": {}}, "<t>").fingerprint()


# -- the run ----------------------------------------------------------------------------------
def test_a_group_run_stores_participants_roles_choices_and_frames_that_verify(
    tmp_path: Path,
) -> None:
    with TestServer() as srv:
        config = parse_config(_group_data(srv.base_url, next_speaker="round_robin"), "<test>")
        summary = anyio.run(Engine(config, tmp_path / "run", progress=False, sleep_scale=0).run)
    assert summary.completed == summary.planned == 4, summary.line()  # 6 personas / 3 seats × 2
    run = tmp_path / "run"
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    turns = pd.read_parquet(run / "turns.parquet")
    seats = pd.read_parquet(run / "participants.parquet")
    assert sorted(dialogues.dialogue_id) == ["g0000-concat", "g0000-ecp", "g0001-concat",
                                              "g0001-ecp"]
    assert set(turns.speaker) <= set(IDS) and set(turns.role) == {"client", "responder"}
    assert (turns.groupby("dialogue_id").turn_index.min() == 0).all()
    first = turns[turns.turn_index == 0]
    assert set(first.speaker) == {"Ana"} and set(first.next_speaker_reason) == {"opener"}
    assert set(turns.next_speaker_reason) == {"opener", "round robin"}
    assert list(turns[turns.dialogue_id == "g0000-ecp"].sort_values("turn_index").speaker) == [
        *IDS, *IDS]
    # Nobody speaks twice in a row.
    for _, t in turns.sort_values(["dialogue_id", "turn_index"]).groupby("dialogue_id"):
        assert (t.speaker.values[1:] != t.speaker.values[:-1]).all()
    # One row per seat and dialogue; three distinct personas fill the client seats.
    assert len(seats) == 16 and list(seats[seats.dialogue_id == "g0000-ecp"].participant_id) == list(IDS)
    for _, s in seats.groupby("dialogue_id"):
        clients = s[s.role == "client"].persona_id
        assert clients.notna().all() and clients.is_unique
        assert s[s.role == "responder"].persona_id.isna().all()
        assert "peer-support facilitator" in s[s.role == "responder"].system_prompt.iloc[0]
    # Conditions are paired: the same personas in the same seats.
    by = seats.set_index(["dialogue_id", "position"]).persona_id
    assert by["g0001-ecp"].equals(by["g0001-concat"])
    # Every turn's frame is rebuilt byte for byte from the tables.
    reader = open_run(run)
    for did in dialogues.dialogue_id:
        view = reader.dialogue(did)
        assert len(view.participants) == 4
        assert all(view.seen(i).verified for i in range(len(view.turns)))
    assert "participants" in json.loads((run / "manifest.json").read_text())["tables"]


def test_a_two_party_run_has_no_group_table_or_columns(tmp_path: Path) -> None:
    with TestServer() as srv:
        config = parse_config(endpoint_config(srv.base_url, personas={"n": 1}), "<test>")
        anyio.run(Engine(config, tmp_path / "run", progress=False, sleep_scale=0).run)
    turns = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    assert "role" not in turns.columns and "next_speaker_reason" not in turns.columns
    assert not (tmp_path / "run" / "participants.parquet").exists()
    assert open_run(tmp_path / "run").dialogue(str(turns.dialogue_id.iloc[0])).participants == []


def _command(cfg: Path, run: Path) -> list[str]:
    return [sys.executable, "-m", "spasm", "generate", "--config", str(cfg), "--out", str(run),
            "--no-progress"]


@pytest.mark.e2e
def test_a_group_run_killed_and_resumed_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    with TestServer(FaultPlan(latency_s=0.04)) as srv:
        data = _group_data(srv.base_url)
        data["personas"] = {"n": 12}
        data["engine"] = {"flush_every": 1}
        # One call at a time, so the kill lands after the first commit and before the end.
        data["backends"]["srv"]["max_concurrency"] = 1
        cfg = tmp_path / "group.json"
        cfg.write_text(json.dumps(data))
        reference = tmp_path / "reference"
        subprocess.run(_command(cfg, reference), check=True, capture_output=True)
        run = tmp_path / "run"
        proc = subprocess.Popen(_command(cfg, run), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        end = time.monotonic() + 60
        while time.monotonic() < end and proc.poll() is None and not any(
                (run / ".commits").glob("0*") if (run / ".commits").is_dir() else []):
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        stored = pd.read_parquet(run / "dialogues.parquet") if (run / "dialogues.parquet").exists() else None
        assert stored is None or len(stored) < 8
        final = subprocess.run(_command(cfg, run), capture_output=True, text=True)
        assert final.returncode == 0, final.stderr
    for table, keys in [("dialogues", ["dialogue_id"]), ("participants", ["dialogue_id", "position"]),
                        ("turns", ["dialogue_id", "turn_index"])]:
        got = pd.read_parquet(run / f"{table}.parquet").sort_values(keys).reset_index(drop=True)
        ref = pd.read_parquet(reference / f"{table}.parquet").sort_values(keys).reset_index(drop=True)
        drop = [c for c in ("latency_s",) if c in got.columns]
        pd.testing.assert_frame_equal(got.drop(columns=drop), ref.drop(columns=drop))
    assert len(pd.read_parquet(run / "dialogues.parquet")) == 8


@pytest.mark.e2e
def test_group_shards_merge_into_the_unsharded_run(tmp_path: Path) -> None:
    """A group shard takes every N-th group dialogue and keeps the whole persona set; the
    merged shards equal the unsharded run, table for table."""
    with TestServer() as srv:
        data = _group_data(srv.base_url)
        data["personas"] = {"n": 9}  # 3 group dialogues × 2 conditions
        cfg = tmp_path / "group.json"
        cfg.write_text(json.dumps(data))
        for out, extra in [("full", []), ("s0", ["--shard", "0/2"]), ("s1", ["--shard", "1/2"])]:
            subprocess.run([*_command(cfg, tmp_path / out), *extra], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "spasm", "merge", str(tmp_path / "s0"),
                    str(tmp_path / "s1"), "--out", str(tmp_path / "merged")],
                   check=True, capture_output=True)
    assert len(pd.read_parquet(tmp_path / "s1" / "dialogues.parquet")) == 2  # group 1 only
    for table in ("dialogues", "participants", "turns", "personas"):
        pd.testing.assert_frame_equal(sorted_rows(tmp_path / "full", table),
                                      sorted_rows(tmp_path / "merged", table))


def test_name_field_seats_fall_back_to_prefix_on_backends_that_drop_names() -> None:
    """The embedded model's chat template renders only role and content: its seats see other
    speakers as a "Name: " prefix even with ``speaker_names: name_field`` (recorded per seat)."""
    from spasm.runner import seat_speaker_names

    data = _group_data("http://127.0.0.1:9/v1", speaker_names="name_field")
    data["backends"]["local"] = {"kind": "embedded"}
    data["participants"][0]["backend"] = "local"
    config = parse_config(data, "<test>")
    assert config.participants is not None
    assert [seat_speaker_names(config, p) for p in config.participants] == [
        "prefix", "name_field", "name_field", "name_field"]


def test_the_rules_stop_a_group_when_every_participant_has_closed() -> None:
    from spasm.termination import GroupRuleDetector

    rules = GroupRuleDetector(IDS, window=2)
    assert rules.window == 4  # a whole round
    h = History()
    for pid in IDS[:-1]:
        h = h.append(pid, f"Thank you all, goodbye! ({pid})")
    scope = _session().scope
    assert anyio.run(rules.check, h, scope) is None  # the facilitator has not closed yet
    h = h.append("Facilitator", "Take care everyone, goodbye!")
    stop = anyio.run(rules.check, h, scope)
    assert stop is not None and stop.detail == "every participant used a closing formula"
    assert anyio.run(rules.check, _history(4).append("Ana", "ok <END>"), scope) is not None

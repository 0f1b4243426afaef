"""``spasm export --role PARTICIPANT_ID`` (and ``client``/``responder`` for every seat) on a
group run: a group run on the test server, exported from each participant's
own frame, loaded back with ``datasets``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from spasm.cli import main
from spasm.config import parse_config
from spasm.dataset import open_run
from spasm.engine import Engine
from spasm.export.formats import TURN_SEPARATOR, alternate
from spasm.export.trainers import llamafactory_keeps
from spasm.testing import TestServer
from tests.conftest import endpoint_config
from tests.test_export import data_file
from tests.test_group import IDS, _group_data

datasets = pytest.importorskip("datasets")

CLIENTS = ("Ana", "Ben", "Carla")


def _group_run(path: Path, **group: Any) -> Path:
    with TestServer() as srv:
        config = parse_config(_group_data(srv.base_url, **{"next_speaker": "round_robin", **group}),
                              "<test>")
        summary = anyio.run(Engine(config, path, progress=False, sleep_scale=0).run)
    assert summary.completed == summary.planned == 4, summary.line()
    return path


@pytest.fixture(scope="module")
def group_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _group_run(tmp_path_factory.mktemp("group") / "run")


@pytest.fixture(scope="module")
def named_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _group_run(tmp_path_factory.mktemp("named") / "run", speaker_names="name_field")


def export(run: Path, out: Path, *flags: str) -> int:
    return main(["export", str(run), "--out", str(out), "--split", "1,0,0", *flags])


def load(out: Path) -> Any:
    return datasets.load_dataset("parquet", data_files=str(data_file(out, "data")),
                                 split="train")


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _turns(run: Path) -> dict[str, list[dict[str, Any]]]:
    reader = open_run(run)
    return {d: reader.dialogue(d).turns for d in reader.dialogues.dialogue_id}


def _check_example(messages: list[dict[str, Any]], me: str, turns: list[dict[str, Any]]) -> None:
    """The example is ``me``'s frame of the dialogue: its turns are assistant messages, the other
    participants' turns between two of its own one user message (each turn a "Name: text"
    paragraph; a lone turn may carry its id in ``name`` instead), so roles alternate as
    LLaMA-Factory and the Llama 2/Mistral/Gemma templates require, ending on its own turn."""
    assert messages[0]["role"] == "system" and f"You appear in it as {me};" in messages[0]["content"]
    assert messages[-1]["role"] == "assistant"
    assert llamafactory_keeps(messages)
    body = messages[1:]
    if turns[0]["speaker"] == me:  # the opener is asked to open, as it was
        assert body[0]["role"] == "user" and not body[0]["content"].startswith(tuple(IDS))
        body = body[1:]
    last = max(k for k, t in enumerate(turns) if t["speaker"] == me)
    runs: list[list[dict[str, Any]]] = []  # the turns up to its last, others' runs grouped
    for t in turns[: last + 1]:
        if t["speaker"] != me and runs and runs[-1][0]["speaker"] != me:
            runs[-1].append(t)
        else:
            runs.append([t])
    assert len(body) == len(runs)  # trimmed after its own last turn, nothing else lost
    for m, run in zip(body, runs, strict=True):
        if run[0]["speaker"] == me:
            assert m["role"] == "assistant" and m["content"] == run[0]["text"]
            continue
        assert m["role"] == "user"
        named = len(run) == 1 and m.get("name") == run[0]["speaker"] and m["content"] == run[0]["text"]
        assert named or m["content"] == TURN_SEPARATOR.join(
            f"{t['speaker']}: {t['text']}" for t in run), m


def test_one_participant_is_exported_from_its_own_frame_and_loads_in_datasets(
    group_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ana"
    assert export(group_run, out, "--role", "Ana") == 0
    rows = load(out)
    turns = _turns(group_run)
    assert rows.num_rows == 4 and set(rows["participant_id"]) == {"Ana"} and set(rows["role"]) == {"client"}
    reader = open_run(group_run)
    for row in rows:
        _check_example(row["messages"], "Ana", turns[row["dialogue_id"]])
        view = reader.dialogue(row["dialogue_id"])
        ana = next(p for p in view.participants if p["participant_id"] == "Ana")
        assert row["persona_id"] == ana["persona_id"]
        if row["condition"] == "ecp":  # what the agent was sent at each of its turns, byte for
            # byte once the others' turns in a row are one message
            frame = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
            for i, t in enumerate(view.turns):
                if t["speaker"] == "Ana":
                    seen = view.seen(i)
                    merged, _, _ = alternate(seen.messages, "")
                    assert seen.verified and frame[:len(merged)] == merged
    # Every format holds the same examples.
    openai = jsonl(out / "openai" / "train.jsonl")
    sharegpt = jsonl(out / "sharegpt" / "train.jsonl")
    assert [r["messages"] for r in openai] == [[dict(m) for m in r] for r in rows["messages"]]
    assert [[c["value"] for c in r["conversations"]] for r in sharegpt] == [
        [m["content"] for m in r] for r in rows["messages"]]
    assert all(r["conversations"][-1]["from"] == "gpt" for r in sharegpt)
    card = json.loads((out / "card.json").read_text())
    assert card["group"] == {"participants": ["Ana"], "roles": {"Ana": "client"},
                             "speaker_names": ["prefix"], "silent_seats": 0,
                             "merged_turns": card["group"]["merged_turns"], "openings_added": 0,
                             "llamafactory_kept": 4}
    assert card["group"]["merged_turns"] > 0  # (their layout: _check_example above)
    readme = (out / "README.md").read_text()
    assert "`Ana` (client)" in readme and "as a prefix of the content" in readme
    assert "LLaMA-Factory keeps all 4 of the 4 examples" in readme
    # The card says what the split guarantees in a group run, and no more.
    assert "first client seat's persona" in readme and "no persona appears in two" not in readme


def test_role_client_exports_every_client_seat_of_every_dialogue(group_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "clients"
    assert export(group_run, out, "--role", "client") == 0
    rows = load(out)
    turns = _turns(group_run)
    assert rows.num_rows == 4 * len(CLIENTS)
    assert sorted(zip(rows["dialogue_id"], rows["participant_id"], strict=True)) == sorted(
        (d, p) for d in turns for p in CLIENTS)
    for row in rows:
        _check_example(row["messages"], row["participant_id"], turns[row["dialogue_id"]])
    by_seat = {(r["dialogue_id"], r["participant_id"]): r["persona_id"] for r in rows}
    assert len({by_seat[(d, p)] for d in ["g0000-ecp"] for p in CLIENTS}) == 3  # one persona a seat
    responder = tmp_path / "facilitator"
    assert export(group_run, responder, "--role", "responder", "--format", "hf") == 0
    rows = load(responder)
    assert set(rows["participant_id"]) == {"Facilitator"} and rows.num_rows == 4
    for row in rows:
        _check_example(row["messages"], "Facilitator", turns[row["dialogue_id"]])


def test_speakers_named_by_the_name_field_keep_it_where_the_format_has_one(
    named_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "named"
    assert export(named_run, out, "--role", "Facilitator") == 0
    rows = load(out)
    turns = _turns(named_run)
    for row in rows:
        _check_example(row["messages"], "Facilitator", turns[row["dialogue_id"]])
        others = [m for m in row["messages"][1:] if m["role"] == "user"]
        # A lone turn keeps its name; merged turns carry their prefixes instead.
        assert others and all(m["name"] in CLIENTS if m.get("name") else
                              m["content"].startswith(tuple(f"{p}: " for p in CLIENTS))
                              for m in others)
    openai = jsonl(out / "openai" / "train.jsonl")
    assert {m.get("name") for r in openai for m in r["messages"] if m["role"] == "user"} <= {
        *CLIENTS, None}
    # ShareGPT has no name field: the id is the prefix there.
    sharegpt = jsonl(out / "sharegpt" / "train.jsonl")
    assert all(c["value"].startswith(tuple(f"{p}: " for p in CLIENTS))
               for r in sharegpt for c in r["conversations"] if c["from"] == "human")
    assert json.loads((out / "card.json").read_text())["group"]["speaker_names"] == ["name_field"]


def test_a_role_no_seat_has_is_a_clear_error(group_run: Path, tmp_path: Path, capsys: Any) -> None:
    assert export(group_run, tmp_path / "zed", "--role", "Zed") == 2
    err = capsys.readouterr().err
    assert "--role 'Zed' is no participant" in err and "Ana, Ben, Carla, Facilitator" in err
    assert export(group_run, tmp_path / "bad", "--role", "Ana Smith") == 2
    assert "--role 'Ana Smith'" in capsys.readouterr().err
    assert not (tmp_path / "zed").exists() and not (tmp_path / "bad").exists()


def test_a_participant_id_on_a_two_party_run_is_a_clear_error(tmp_path: Path, capsys: Any) -> None:
    with TestServer() as srv:
        config = parse_config(endpoint_config(srv.base_url, personas={"n": 1}), "<test>")
        anyio.run(Engine(config, tmp_path / "run", progress=False, sleep_scale=0).run)
    assert export(tmp_path / "run", tmp_path / "out", "--role", "Ana") == 2
    assert "two-party run" in capsys.readouterr().err


@pytest.mark.parametrize("next_speaker", ["round_robin", "random"])
def test_every_example_of_every_format_is_one_llamafactory_keeps(
        tmp_path: Path, next_speaker: str) -> None:
    """Several other participants speak in a row (round robin always, random often): their turns
    are one user message, so LLaMA-Factory's reader keeps every example of every file (it kept
    0-3 of 15), and the card says so; with ``--ending keep`` it says how many it will skip."""
    run = _group_run(tmp_path / "run", next_speaker=next_speaker)
    for role in ("client", "responder", "both"):
        out = tmp_path / f"out-{role}"
        assert export(run, out, "--role", role) == 0
        rows = [list(r) for r in load(out)["messages"]]
        openai = [r["messages"] for r in jsonl(out / "openai" / "train.jsonl")]
        sharegpt = [[{"role": {"human": "user", "gpt": "assistant"}.get(c["from"], c["from"]),
                      "content": c["value"]} for c in r["conversations"]]
                    for r in jsonl(out / "sharegpt" / "train.jsonl")]
        for examples in (rows, openai, sharegpt):
            assert examples and all(llamafactory_keeps(m) for m in examples)
        n = len(rows)
        assert f"LLaMA-Factory keeps all {n} of the {n} examples" in (out / "README.md").read_text()
    keep = tmp_path / "keep"
    assert export(run, keep, "--role", "client", "--ending", "keep") == 0
    messages = [r["messages"] for r in jsonl(keep / "openai" / "train.jsonl")]
    kept = sum(llamafactory_keeps(m) for m in messages)
    card = json.loads((keep / "card.json").read_text())["group"]
    assert card["llamafactory_kept"] == kept < len(messages)
    assert (f"LLaMA-Factory keeps {kept} of the {len(messages)} examples"
            in (keep / "README.md").read_text())


def test_alternate_merges_runs_of_others_and_opens_a_frame_that_starts_on_its_own_turn() -> None:
    system = {"role": "system", "content": "S"}
    frame = [system, {"role": "assistant", "content": "hi"},
             {"role": "user", "content": "Ben: one"}, {"role": "user", "content": "two", "name": "Carla"},
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": "three", "name": "Ben"},
             {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
             {"role": "tool", "content": "42", "tool_call_id": "c1"},
             {"role": "assistant", "content": "done"}]
    out, merged, opened = alternate(frame, "Open.")
    assert opened and merged == 1
    assert out == [system, {"role": "user", "content": "Open."}, {"role": "assistant", "content": "hi"},
                   {"role": "user", "content": f"Ben: one{TURN_SEPARATOR}Carla: two"},
                   {"role": "assistant", "content": "ok"},
                   {"role": "user", "content": "three", "name": "Ben"},  # a lone turn keeps its name
                   *frame[6:]]
    assert llamafactory_keeps(out) and not llamafactory_keeps(frame)
    assert alternate(out, "Open.") == (out, 0, False)  # already alternating: unchanged

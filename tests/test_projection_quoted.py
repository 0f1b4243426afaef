"""The third projection, ``quoted``: one quoted transcript with egocentric labels, no chat roles.

Frames (every utterance once, in order, labelled from the viewer's side, mirror images), the
registry and config, and a three-condition run on the test server: the reader rebuilds what
each agent saw byte for byte, and ``spasm compare`` reports the three pairs.
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pandas as pd

from spasm.config import parse_config
from spasm.engine import Engine
from spasm.evaluation.compare import compare_conditions
from spasm.history import History
from spasm.projection import (
    QUOTED_INSTRUCTION,
    Viewer,
    get_projection,
    projection_names,
    quoted,
    quoted_labels,
)
from spasm.registry import PROJECTIONS
from spasm.testing import TestServer
from tests.conftest import config_from, endpoint_config

H = (
    History()
    .append("client", "Hi, my washing machine broke.")
    .append("responder", "Sorry to hear that. When did you buy it?")
    .append("client", "Last March.\nIs it still under warranty?")
    .append("responder", "Yes, the warranty lasts two years.")
)
CLIENT = Viewer("client", "You are Ana.", responder_role="customer-service agent")
RESPONDER = Viewer("responder", "You are an agent.", responder_role="customer-service agent")


def _lines(messages: list[dict[str, str]]) -> list[str]:
    """The quoted transcript's utterances, continuation lines joined back."""
    body = messages[1]["content"]
    quoted_lines = [line for line in body.split("\n") if line.startswith(">")]
    out: list[str] = []
    for line in quoted_lines:
        text = line[2:] if line.startswith("> ") else ""
        if re.match(r"^(You|The [^:]+): ", text):
            out.append(text)
        else:
            out[-1] += "\n" + text
    return out


def test_quoted_is_system_then_one_user_message_without_chat_roles() -> None:
    for viewer in (CLIENT, RESPONDER):
        msgs = quoted(H, viewer)
        assert [m["role"] for m in msgs] == ["system", "user"]
        assert msgs[0]["content"] == viewer.system_prompt
        assert msgs[1]["content"].endswith(QUOTED_INSTRUCTION)


def test_every_utterance_appears_once_in_order_with_the_viewers_labels() -> None:
    for viewer in (CLIENT, RESPONDER):
        lines = _lines(quoted(H, viewer))
        assert len(lines) == len(H)
        labels = quoted_labels(viewer)
        for line, u in zip(lines, H, strict=True):
            assert line == f"{labels[u.speaker]}: {u.content}"
        body = quoted(H, viewer)[1]["content"]
        for u in H:
            first = u.content.split("\n")[0]
            assert body.count(first) == 1


def test_labels_come_from_the_viewers_side() -> None:
    assert quoted_labels(CLIENT) == {"client": "You", "responder": "The customer-service agent"}
    assert quoted_labels(RESPONDER) == {"client": "The person", "responder": "You"}
    assert quoted_labels(Viewer("client", "x"))["responder"] == "The other person"
    body = quoted(H, CLIENT)[1]["content"]
    assert "> You: Hi, my washing machine broke." in body
    assert "> The customer-service agent: Sorry to hear that." in body
    assert "Client:" not in body and "Responder:" not in body


def test_the_two_frames_are_mirror_images() -> None:
    c, r = _lines(quoted(H, CLIENT)), _lines(quoted(H, RESPONDER))
    swapped = []
    for line in c:
        label, text = line.split(": ", 1)
        new = {"You": "The person", "The customer-service agent": "You"}[label]
        swapped.append(f"{new}: {text}")
    assert swapped == r
    # The content after each label is untouched.
    assert [line.split(": ", 1)[1] for line in c] == [u.content for u in H]


def test_empty_history_is_the_opening_then_the_instruction() -> None:
    msgs = quoted(History(), CLIENT)
    assert msgs[1]["content"] == f"{CLIENT.opening}\n\n{QUOTED_INSTRUCTION}"


def test_quoted_is_registered_and_accepted_by_the_config() -> None:
    assert "quoted" in projection_names() and "quoted" in PROJECTIONS
    assert get_projection("quoted") is quoted
    cfg = parse_config({"conditions": ["ecp", "concat", "quoted"]})
    assert cfg.conditions == ["ecp", "concat", "quoted"]


def test_three_conditions_run_read_back_and_compared_pairwise(tmp_path: Path) -> None:
    data = endpoint_config("http://127.0.0.1:1/v1", conditions=["ecp", "concat", "quoted"],
                           personas={"n": 2})
    with TestServer() as srv:
        data["backends"]["srv"]["base_url"] = srv.base_url
        summary = anyio.run(Engine(config_from(data), tmp_path / "run", progress=False,
                                   sleep_scale=0.0).run)
    assert summary.completed == summary.planned == 6, summary.line()
    import spasm

    run = spasm.open_run(tmp_path / "run")
    dialogues = run.dialogues
    assert sorted(dialogues.condition.unique()) == ["concat", "ecp", "quoted"]
    for did in dialogues.loc[dialogues.condition == "quoted", "dialogue_id"]:
        view = run.dialogue(did)
        for i, turn in enumerate(view.turns):
            seen = view.seen(i)
            assert seen.verified is True
            assert [m["role"] for m in seen.messages] == ["system", "user"]
            if i >= 2:
                assert "> You: " in seen.messages[1]["content"]
            if i:
                partner = "The customer-service agent" if turn["speaker"] == "client" else "The person"
                assert f"> {partner}: " in seen.messages[1]["content"]

    # spasm compare: every pair of the three conditions, on the same personas and seeds.
    frame = dialogues[["dialogue_id", "persona_id", "conversation_index", "seed", "pairing",
                       "condition", "harness_level", "n_utterances"]].copy()
    frame["echo_score"] = [0.1 * i for i in range(len(frame))]
    comparison = compare_conditions(pd.DataFrame(frame))
    pairs = {(c.baseline, c.condition) for c in comparison.contrasts}
    assert pairs == {("ecp", "concat"), ("ecp", "quoted"), ("concat", "quoted")}
    assert all(c.n_pairs == 2 for c in comparison.contrasts)

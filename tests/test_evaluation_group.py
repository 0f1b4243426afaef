"""Role confusion in group dialogues: each detector on planted data with a
known answer, then `spasm eval` and `spasm compare` end to end on a small group run written
through the run store and read back from Parquet."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest

from spasm.dataset.reader import open_run
from spasm.dataset.rows import Row, Str
from spasm.dataset.store import RunStore
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.compare import load_comparison
from spasm.evaluation.group_detectors import (
    ECHO_THRESHOLD,
    dialogue_impersonations,
    find_impersonations,
    longest_alternation,
    pair_echoing,
    seat_drift,
    silences,
)
from spasm.evaluation.loader import GroupDialogue, Participant
from spasm.evaluation.testing import LookupEmbedder
from spasm.personas.schema import load_schema
from tests.eval_cli import eval_cli

register_embedder("lookup", LookupEmbedder)

IDS = ["Ana", "Ben", "Cleo", "Facilitator"]


# --------------------------------------------------------------------------- impersonation


@pytest.mark.parametrize(
    ("text", "impersonated", "kind", "evidence"),
    [
        ("Ben: I lost my job last week.", "Ben", "prefix", "Ben:"),
        ("**Ben:** I lost my job last week.", "Ben", "prefix", "**Ben:**"),
        ("**Ben**: I lost my job last week.", "Ben", "prefix", "**Ben**:"),
        ("ben - I lost my job last week.", "Ben", "prefix", "ben -"),
        ("I hear you.\n**Facilitator:** Let's move on.", "Facilitator", "line", "**Facilitator:**"),
        ("I'm Cleo and I have two kids.", "Cleo", "first_person", "I'm Cleo"),
        ("I\u2019m Cleo and I have two kids.", "Cleo", "first_person", "I\u2019m Cleo"),
        ("As Facilitator, I suggest we pause.", "Facilitator", "first_person", "As Facilitator, I"),
    ],
)
def test_a_planted_impersonation_is_flagged_with_its_span(
    text: str, impersonated: str, kind: str, evidence: str
) -> None:
    hits = find_impersonations(text, "Ana", IDS)
    assert [(h.impersonated, h.kind) for h in hits] == [(impersonated, kind)]
    assert text[hits[0].start : hits[0].end] == evidence


@pytest.mark.parametrize(
    "text",
    [
        "Ana: I lost my job.",  # her own name
        "Ben, what do you think?",  # addressing, not speaking as
        "- Ben: lost his job\n- Cleo: two kids",  # a summary list
        "> Ben: I lost my job",  # a quotation
        "I'm Ben's sister, actually.",
        "Thanks Ben - that helps.",
        "Yes I am, Ben.",
    ],
)
def test_no_impersonation_in_ordinary_speech(text: str) -> None:
    assert find_impersonations(text, "Ana", IDS) == []


def _dialogue(speakers: list[str], texts: list[str], condition: str = "ecp") -> GroupDialogue:
    seats = tuple(
        Participant(pid, i, "responder" if pid == "Facilitator" else "client",
                    None if pid == "Facilitator" else f"p-{pid.lower()}")
        for i, pid in enumerate(IDS)
    )
    return GroupDialogue("d1", condition, "a/b", seats, tuple(speakers), tuple(texts))


def test_dialogue_impersonations_flag_each_utterance_once_with_its_id() -> None:
    d = _dialogue(
        ["Facilitator", "Ana", "Ben", "Cleo"],
        ["Welcome, everyone.", "**Ben:** I also lost my job.\nBen: really.", "Hi all.",
         "As Ana, I agree."],
    )
    hits = dialogue_impersonations(d)
    assert [(h.index, h.speaker, h.impersonated) for h in hits] == [(1, "Ana", "Ben"), (3, "Cleo", "Ana")]
    assert hits[0].evidence == "**Ben:** I also lost my job."


# --------------------------------------------------------------------------- echoing

RELAYED = "I lost my job at the bakery last month and the rent is due on Friday"


def test_a_planted_verbatim_relay_between_two_of_four_participants() -> None:
    speakers = ["Facilitator", "Ana", "Ben", "Cleo", "Facilitator", "Cleo"]
    texts = [
        "Welcome everyone, who would like to start today?",
        RELAYED + ".",
        "My daughter started school and mornings are chaos for us.",
        "I keep arguing with my brother about our mother's care home.",
        "Thank you all for sharing so openly with the group.",
        "Well, " + RELAYED.lower() + ", honestly.",  # Cleo relays Ana's line verbatim
    ]
    pairs = pair_echoing(speakers, texts, IDS)
    assert len(pairs) == 12  # every ordered pair of the four
    relay = pairs[("Cleo", "Ana")]
    # 16 content 3-grams, of which the 14 of Ana's 16-word line are copied ("well i lost" and
    # "on friday honestly" are Cleo's own).
    assert relay.relays and relay.score == pytest.approx(14 / 16) and relay.index == 5
    assert relay.span.lower().startswith("i lost my job at the bakery")
    others = {k: p.score for k, p in pairs.items() if k != ("Cleo", "Ana")}
    assert max(others.values()) < ECHO_THRESHOLD
    assert pairs[("Ana", "Cleo")].score == 0.0  # quoting back never makes the source a copier


def test_pair_echoing_is_the_two_party_copy_signal() -> None:
    from spasm.evaluation.echoing import rule_echoing
    from spasm.evaluation.loader import Conversation

    texts = ("My washing machine leaks water all over the kitchen floor.",
             "A washing machine that leaks water all over the kitchen floor needs a new seal.",
             "So the washing machine leaks water all over the kitchen floor, you say.")
    speakers = ("client", "responder", "client")
    conv = Conversation("d", "p", 0, "ecp", "a/b", "", speakers, texts)
    import numpy as np

    rule = rule_echoing(conv, np.eye(3, dtype=np.float32))
    pairs = pair_echoing(list(speakers), list(texts))
    for s in rule.turns:
        partner = "responder" if s.speaker == "client" else "client"
        if s.copy:
            assert pairs[(s.speaker, partner)].score >= round(s.copy, 4)
    assert pairs[("client", "responder")].score == pytest.approx(max(
        s.copy for s in rule.turns if s.speaker == "client"), abs=1e-4)


# --------------------------------------------------------------------------- silence and loops


def test_an_addressed_but_silent_participant_is_counted() -> None:
    speakers = ["Facilitator", "Ana", "Facilitator", "Ana", "Cleo", "Facilitator", "Ben", "Ana"]
    texts = [
        "Ben, how was your week?",  # Ben does not speak in the next 4
        "Mine was hard.",
        "@cleo, anything to add?",  # Cleo answers two later
        "I want to say more.",
        "Yes, a little.",
        "Thanks. Ben?",  # answered next
        "Sorry, I was quiet.",
        "Welcome back Ben, and Facilitator thanks",  # window runs past the end: undecided
    ]
    found = silences(speakers, texts, IDS)
    assert [(a.index, a.addressee, a.answered) for a in found] == [
        (0, "Ben", False), (2, "Cleo", True), (5, "Ben", True), (7, "Ben", None),
        (7, "Facilitator", None),
    ]


def test_a_speaker_label_is_not_an_address() -> None:
    assert silences(["Ben", "Cleo"], ["**Ana:** I feel lost.", "ok"], ["Ana", "Ben", "Cleo"], k=1) == []


def test_a_lowercase_common_word_is_not_an_address() -> None:
    assert silences(["Ana", "Cleo"], ["I will ask ben.", "ok"], ["Ana", "Ben", "Cleo"], k=1) == []
    assert [a.addressee for a in silences(["Ana"], ["ben?"], ["Ana", "ben"], k=1)] == ["ben"]


def test_a_planted_a_b_loop_is_the_longest_alternation() -> None:
    speakers = ["Facilitator", "Cleo", "Ana", "Ben", "Ana", "Ben", "Ana", "Ben", "Cleo", "Cleo"]
    loop = longest_alternation(speakers)
    assert (loop.length, loop.start, loop.pair) == (6, 2, ("Ana", "Ben"))
    assert longest_alternation(["A", "B", "C", "A", "B", "C"]).length == 2
    assert longest_alternation(["A", "A", "A"]).length == 1
    assert longest_alternation([]).length == 0


def test_seat_drift_runs_the_drift_metric_on_each_client_seat() -> None:
    d = _dialogue(["Facilitator", "Ana", "Ben", "Ana", "Ben"],
                  ["Hello.", "a0", "b0", "a0", "b1"])
    embedder = LookupEmbedder(table={"a0": [1, 0, 0], "b0": [1, 0, 0], "b1": [0, 1, 0]}, dim=3)
    drift = seat_drift([d], {}, embedder.embed)
    assert set(drift) == {("d1", "Ana"), ("d1", "Ben")}  # the facilitator is no client; Cleo is silent
    assert drift[("d1", "Ana")]["utterance"] == pytest.approx(0.0)  # repeats its opening
    assert drift[("d1", "Ben")]["utterance"] == pytest.approx(1.0)  # orthogonal to its opening
    assert math.isnan(drift[("d1", "Ana")]["concerns"])  # no persona fields given


# --------------------------------------------------------------------------- end to end


def _group_texts(k: int, condition: str) -> tuple[list[str], list[str]]:
    """A 4-participant dialogue; under CONCAT Ben speaks as Ana and Cleo relays Ana's line,
    Cleo is addressed and stays silent, and Ana and Ben lock into a loop."""
    if condition == "ecp":
        speakers = ["Facilitator", "Ana", "Ben", "Cleo", "Facilitator", "Ana", "Cleo", "Ben"]
        texts = [
            f"Welcome to session {k}. Who would like to begin?",
            RELAYED + f" (week {k}).",
            "My daughter started school and mornings are chaos for us.",
            "I keep arguing with my brother about our mother's care home.",
            "Cleo, that sounds heavy. Ana, how are you holding up?",
            "Better than last week, thank you for asking.",
            "It is heavy, thanks for noticing.",
            "I relate to the mornings part a lot, honestly.",
        ]
    else:
        speakers = ["Facilitator", "Ana", "Ben", "Ana", "Ben", "Ana", "Ben", "Cleo"]
        texts = [
            f"Welcome to session {k}. Cleo, would you like to begin?",
            RELAYED + f" (week {k}).",
            "**Ana:** I also feel lost without work.",
            "Thanks Ben, it helps to hear that.",
            "Ana: we should meet up sometime.",
            "That would be nice.",
            "Definitely, let's do it.",
            "Well, " + RELAYED.lower() + f" (week {k}), right?",
        ]
    return speakers, texts


def _write_group_run(run: Path, n: int = 4) -> Path:
    schema = load_schema(None)
    store = RunStore(run)
    store.create()
    store.set_persona_fields(schema.field_names, schema.integer_fields())
    store.declare_group()  # the turns' group columns; the participants table is every run's
    personas = [{"persona_id": pid, "persona_index": i, "card": f"{name} is in a support group.",
                 "concern": f"{name}'s worry"}
                for i, (pid, name) in enumerate([("p-ana", "Ana"), ("p-ben", "Ben"), ("p-cleo", "Cleo")])]
    dialogues: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    seats: list[dict[str, Any]] = []
    for k in range(n):
        for condition in ("ecp", "concat"):
            did = f"g-k{k}-smol-smol-{condition}"
            speakers, texts = _group_texts(k, condition)
            dialogues.append({
                "dialogue_id": did, "persona_id": "p-ana", "conversation_index": k,
                "condition": condition, "pairing": "smol/smol", "client_backend": "smol",
                "client_model": "m", "responder_backend": "smol", "responder_model": "m",
                "seed": 100 + k, "n_utterances": len(texts), "termination_reason": "max_utterances",
            })
            turns += [{"dialogue_id": did, "turn_index": t, "speaker": s, "text": x,
                       "role": "responder" if s == "Facilitator" else "client",
                       "next_speaker_reason": None if t == 0 else "round_robin"}
                      for t, (s, x) in enumerate(zip(speakers, texts, strict=True))]
            seats += [{"dialogue_id": did, "participant_id": pid, "position": i,
                       "role": "responder" if pid == "Facilitator" else "client",
                       "persona_id": None if pid == "Facilitator" else f"p-{pid.lower()}",
                       "backend": "smol", "model": "m", "level": "A"}
                      for i, pid in enumerate(IDS)]
    store.write_batch("000001", {"personas": personas, "dialogues": dialogues, "turns": turns,
                                 "participants": seats})
    store.compact_all()
    store.write_json("manifest.json", {"kind": "synthetic", "schema_version": "1.6"})
    return run


@pytest.mark.e2e
def test_spasm_eval_reports_role_confusion_of_a_group_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _write_group_run(tmp_path / "run")
    reader = open_run(run)
    assert reader.has("participants")
    assert {"role", "next_speaker_reason"} <= set(reader.stored_columns("turns"))

    assert eval_cli(["eval", str(run), "--embedder", "lookup", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Group role confusion" in out

    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    ecp, concat = per.loc["g-k0-smol-smol-ecp"], per.loc["g-k0-smol-smol-concat"]
    assert ecp["group_n_participants"] == 4 and ecp["persona_set"] == "p-ana+p-ben+p-cleo"
    assert not ecp["group_impersonation"] and not ecp["group_echo"] and not ecp["group_loop"]
    assert ecp["group_silences"] == 0 and ecp["group_silence_rate"] == 0.0
    assert concat["group_impersonation"] and concat["group_impersonation_share"] == pytest.approx(2 / 8)
    assert "Ben as Ana" in concat["group_impersonation_evidence"]
    assert concat["group_echo"] and concat["group_echo_pairs"].startswith("Cleo<-Ana")
    assert concat["group_loop"] and concat["group_loop_longest"] == 6
    assert concat["group_loop_pair"] == "Ana/Ben"
    # Cleo is named at 0 and never speaks in the next four; Ben is named at 3 and answers; the
    # "**Ana:**" and "Ana:" labels Ben writes are impersonations, not addresses.
    assert concat["group_silences"] == 1 and concat["group_silence_rate"] == 0.5

    seats = pd.read_parquet(run / "eval" / "per_participant.parquet")
    assert len(seats) == 8 * 4
    ben = seats[(seats["dialogue_id"] == "g-k0-smol-smol-concat") & (seats["participant_id"] == "Ben")]
    assert ben["impersonations"].item() == 2 and ben["impersonated"].item() == "Ana"
    cleo = seats[(seats["dialogue_id"] == "g-k0-smol-smol-concat") & (seats["participant_id"] == "Cleo")]
    assert cleo["silences"].item() == 1 and cleo["relays_from"].item() == "Ana"

    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    group = metrics["group"]
    assert group["dialogues"] == 8 and group["participants_max"] == 4
    rates = {(r["metric"], r["condition"]): r for r in group["rates"]}
    assert rates[("impersonation", "concat")]["rate"] == 1.0
    assert rates[("impersonation", "ecp")]["rate"] == 0.0
    assert rates[("loop", "concat")]["n"] == 4 and rates[("loop", "concat")]["ci_low"] > 0.3
    assert rates[("echo", "all")]["n_flagged"] == 4
    stats = {(s["metric"], s["condition"]): s for s in group["stats"]}
    assert stats[("impersonation_share", "concat")]["mean"] == pytest.approx(0.25)
    assert stats[("drift_utterance", "ecp")]["n"] == 4  # Ana, Ben and Cleo each speak twice
    assert {e["kind"] for e in group["examples"]} == {"impersonation", "echo", "silence", "loop"}

    comparison = load_comparison(run / "eval" / "compare.json")
    assert "persona_set" in comparison.pair_key
    contrast = next(c for c in comparison.contrasts
                    if c.metric == "group_impersonation_share" and c.pairing == "all")
    assert contrast.n_pairs == 4 and contrast.delta == pytest.approx(-0.25)

    assert eval_cli(["compare", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "Group role confusion" in printed and "group_loop" in printed


@pytest.mark.e2e
def test_a_two_party_run_gets_no_group_columns(tmp_path: Path) -> None:
    from spasm.dataset.synthetic import write_run

    run = write_run(tmp_path / "run", [{"persona_id": "p0", "card": "Bikes."}],
                    [{"dialogue_id": "d0", "persona_id": "p0", "texts": ["Hi there.", "Hello."]}])
    metrics = evaluate(run, embedder="lookup", progress=False)
    assert metrics.group is None
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet")
    assert not [c for c in per.columns if c.startswith("group_") or c == "persona_set"]
    assert not (run / "eval" / "per_participant.parquet").exists()


def test_a_participants_table_without_ids_is_a_user_error(tmp_path: Path) -> None:
    from spasm.errors import UserError

    class Seat(Row):
        table: ClassVar[str] = "participants"
        keys: ClassVar[tuple[str, ...]] = ("dialogue_id",)
        dialogue_id: Str

    run = _write_group_run(tmp_path / "run", n=1)
    store = RunStore(run)
    store.models["participants"] = Seat
    store.replace_table("participants", [{"dialogue_id": "g-k0-smol-smol-ecp"}])
    with pytest.raises(UserError, match="participant_id"):
        evaluate(run, embedder="lookup", progress=False, write=False)

"""QA scans: planted leaks in real runs are found and redacted; ordinary text is left alone."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest

from spasm.cli import main
from spasm.dataset import AnnotationRow, RunStore, open_run
from spasm.dataset.synthetic import write_run
from spasm.engine import Engine
from spasm.errors import UserError
from spasm.export.dedup import minhash_available
from spasm.export.pipeline import ExportOptions, export_run
from spasm.export.qa import prompt_grams, scan_run, structure_findings
from spasm.export.scans import ScanContext, prompt_ref, redact, scan_text
from spasm.export.select import Selection
from spasm.export.stream import Turn, is_grouped, iter_dialogues, turn_index
from spasm.personas.schema import load_schema
from spasm.testing import TestServer
from tests.conftest import config_from, endpoint_config

# --------------------------------------------------------------------------- a scripted run

#: (kind, sentence, the exact string a scan must find)
PLANTS: list[tuple[str, str, str]] = [
    ("email", "Please write to support.team@example.org with the details.", "support.team@example.org"),
    ("phone", "You can call us on +44 20 7946 0958 any weekday.", "+44 20 7946 0958"),
    ("phone", "Our other line is (555) 010-2030 if that is easier.", "(555) 010-2030"),
    ("url", "The claim form is at https://help.example.com/forms/claim?id=7 online.",
     "https://help.example.com/forms/claim?id=7"),
    ("url", "See www.example.net/refunds for the full policy.", "www.example.net/refunds"),
    ("number", "The card we have on file is 4111 1111 1111 1111 for now.", "4111 1111 1111 1111"),
    ("number", "Your account number with us is 12345678901 as I see it.", "12345678901"),
    ("ai_identity", "As an AI language model, I cannot decide that for you.", "As an AI language model"),
    ("prompt_leak", "My brief says to help them with care and competence, ask a question when you need "
     "more information.", "help them with care and competence, ask a question when you need more "
     "information"),
]
CLIENT_LINES = [
    "I bought the machine on 14 March and it stopped working after 3 weeks.",
    "It cost me about 240 pounds, which is a lot for us right now.",
    "My daughter is 7 and starts at the new school in September.",
    "I work two 12-hour shifts a week, so mornings are hard for me.",
    "The letter said the 2019-2024 rates apply, which confused me.",
    "I paid 12.50 per month on 01/02/2023 and then it went up to 1,200 a year.",
    "We moved to Leeds in 2021 and the flat is on the 3rd floor.",
    "The reference on my letter is A12345, if that helps.",
    "Honestly I am not sure what the next step is.",
    "I called twice last week, on Monday at 9:30 and on Friday.",
    "My neighbour had the same problem with the model 550 boiler.",
    "Is there a cheaper option? I can spend maybe 50 to 80 pounds.",
]
RESPONDER_LINES = [
    "I understand. Could you tell me the date on the receipt?",
    "Thanks for explaining. Most repairs take 5 to 10 working days.",
    "The call-out fee is 49.99, and parts are covered for 2 years.",
    "That sounds stressful. Let us go through it one step at a time.",
    "I can book an engineer for Tuesday between 8 and 12.",
    "Could you check the serial number on the back of the unit?",
    "In most cases like yours the fee is waived after 6 weeks.",
    "I have added a note to your file so my colleagues can see it.",
    "Do you still have the original box and the manual?",
    "A partial refund of 30 percent is sometimes possible.",
]


def _pick(body: dict[str, Any], salt: str) -> tuple[int, int]:
    digest = hashlib.sha256((salt + json.dumps(body["messages"])).encode()).digest()
    return digest[0], digest[1]


def scripted_reply(plant: bool) -> Any:
    """Ordinary replies; with ``plant``, about half the Responder's carry one of PLANTS."""

    def reply(body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        if "Someone has come to talk with you" not in system:
            a, b = _pick(body, "c")
            return f"{CLIENT_LINES[a % len(CLIENT_LINES)]} {CLIENT_LINES[b % len(CLIENT_LINES)]}"
        a, b = _pick(body, "r")
        text = RESPONDER_LINES[a % len(RESPONDER_LINES)]
        if plant and b % 2 == 0:
            text += " " + PLANTS[(b // 2) % len(PLANTS)][1]
        return text

    return reply


def generate_run(out: Path, *, plant: bool, personas: int = 6) -> Path:
    """A real run through the engine against the test server (ECP and CONCAT, 8 utterances)."""
    with TestServer(reply=scripted_reply(plant)) as srv:
        cfg = config_from(endpoint_config(srv.base_url, personas={"n": personas},
                                          conditions=["ecp", "concat"]))
        summary = anyio.run(Engine(cfg, out, progress=False).run)
    assert summary.completed == summary.planned == 2 * personas
    return out


def planted_counts(turns: pd.DataFrame) -> dict[str, int]:
    """How many times each kind was planted (from the run's own turns)."""
    counts: dict[str, int] = {}
    for kind, _, needle in PLANTS:
        counts[kind] = counts.get(kind, 0) + sum(t.count(needle) for t in turns.text)
    return counts


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_run(tmp_path_factory.mktemp("planted") / "run", plant=True)


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_run(tmp_path_factory.mktemp("clean") / "run", plant=False)


# --------------------------------------------------------------------------- scans, pure

def test_contact_strings_are_found_with_types_and_redacted_with_typed_placeholders() -> None:
    text = ("Mail jane.doe+x@example.co.uk, call +44 20 7946 0958 or 555-123-4567, card "
            "4111-1111-1111-1111, IBAN GB29 NWBK 6016 1331 9268 19, see https://x.example.com/a?b=1.")
    found = scan_text(text, ScanContext())
    assert [(f.kind, f.evidence) for f in found] == [
        ("email", "jane.doe+x@example.co.uk"), ("phone", "+44 20 7946 0958"), ("phone", "555-123-4567"),
        ("number", "4111-1111-1111-1111"), ("number", "GB29 NWBK 6016 1331 9268 19"),
        ("url", "https://x.example.com/a?b=1"),
    ]
    redacted, replaced = redact(text, found)
    assert redacted == ("Mail [EMAIL], call [PHONE] or [PHONE], card [NUMBER], IBAN [NUMBER], "
                        "see [URL].")
    assert [(r.original, r.placeholder) for r in replaced] == [(f.evidence, f.redaction) for f in found]
    assert all(text[r.start:r.end] == r.original for r in replaced)


def test_ordinary_text_with_numbers_dates_and_amounts_has_no_findings() -> None:
    ordinary = [*CLIENT_LINES, *RESPONDER_LINES,
                "Between 2019-2024 the price rose from 1,200,000 to 1 200 000 000, e.g. at 3.5% a year.",
                "The date was 12.03.2024 or 2024-03-12; my postcode is SW1A 1AA.",
                "I'm a machine operator and I'm an AI researcher at the university, Mr. Smith said.",
                "Ticket 557-52, order #4521, version 3.11.2, at 10:45 on 1/2/2023.", "", "   "]
    findings = [f for t in ordinary for f in scan_text(t, ScanContext()) if f.kind != "empty_turn"]
    assert findings == []
    assert [f.kind for f in scan_text("  \n", ScanContext())] == ["empty_turn"]


def test_prompt_leak_is_found_but_the_persona_saying_its_own_concern_is_not() -> None:
    card = ('You are Ana, a nurse. In your own words, your concern is: "whether we should drop the '
            'afternoon nap for our toddler". Do not give advice and do not take over the role.')
    ref = prompt_ref([card], own=["whether we should drop the afternoon nap for our toddler"])
    own_words = ScanContext("client", ref)
    in_character = "I keep wondering whether we should drop the afternoon nap for our toddler."
    assert scan_text(in_character, own_words) == []
    leak = scan_text("Well, do not give advice and do not take over the role, they told me.", own_words)
    assert [(f.kind, f.evidence) for f in leak] == [
        ("prompt_leak", "do not give advice and do not take over the role")]
    # The projection's own framing text counts as part of the prompt.
    framing = ScanContext("client", prompt_grams("", "", ()))
    opening = "The conversation starts now. Write your opening message."
    assert [f.kind for f in scan_text(opening, framing)] == ["prompt_leak"]


def test_alternation_and_turn_order_breaks_are_reported_per_turn() -> None:
    good = [Turn(0, "client", "a"), Turn(1, "responder", "b"), Turn(2, "client", "c")]
    assert structure_findings(good) == []
    bad = [Turn(0, "client", "a"), Turn(1, "client", "b"), Turn(3, "responder", "c"), Turn(4, "robot", "d")]
    assert [i for i, _ in structure_findings(bad)] == [1, 3, 4]


# --------------------------------------------------------------------------- real runs

def test_planted_leaks_in_a_generated_run_are_all_found(planted_run: Path, capsys: Any) -> None:
    turns = open_run(planted_run).turns
    planted = planted_counts(turns)
    assert all(planted[kind] > 0 for kind, _, _ in PLANTS), planted  # the script planted each kind
    assert main(["qa", str(planted_run)]) == 0
    out = capsys.readouterr().out
    qa = open_run(planted_run).df("qa")
    found = qa.kind.value_counts().to_dict()
    for kind in ("email", "phone", "url", "number", "ai_identity", "prompt_leak"):
        assert found.get(kind, 0) == planted[kind], (kind, found)
        assert f"\n{kind:<16} {planted[kind]:>9}" in "\n" + out
    # Every planted string is a finding's evidence at its exact offsets.
    text = turns.set_index(["dialogue_id", "turn_index"]).text
    for row in qa[qa.start.notna()].itertuples():
        assert text[(row.dialogue_id, row.turn_index)][int(row.start):int(row.end)] == row.evidence
    contact = qa[qa.kind.isin(["email", "phone", "url", "number"])]
    assert set(contact.redaction) == {"[EMAIL]", "[PHONE]", "[URL]", "[NUMBER]"}
    assert qa[qa.kind.isin(["ai_identity", "prompt_leak"])].redaction.isna().all()
    assert set(found) <= {"email", "phone", "url", "number", "ai_identity", "prompt_leak"}


def test_a_clean_generated_run_has_zero_findings(clean_run: Path) -> None:
    result = scan_run(open_run(clean_run))
    assert result.rows == []
    assert result.summary.dialogues == 12 and result.summary.turns == 96


def test_a_rescan_replaces_the_qa_table(planted_run: Path) -> None:
    assert main(["qa", str(planted_run)]) == 0
    first = open_run(planted_run).df("qa")
    assert main(["qa", str(planted_run), "--json"]) == 0
    second = open_run(planted_run).df("qa")
    assert len(second) == len(first) > 0
    assert len(list((planted_run / "qa.parquet").glob("part-*.parquet"))) == 1


# --------------------------------------------------------------------------- duplicates

def _words(rng: random.Random, n: int) -> str:
    vocab = [f"w{i}" for i in range(400)]
    return " ".join(rng.choice(vocab) for _ in range(n))


def _dup_run(path: Path, *, scrambled: bool = False) -> Path:
    rng = random.Random(3)
    personas = [{"persona_id": f"p{i}", "card": f"You are person {i}."} for i in range(6)]
    base = {f"d{i:02d}": [_words(rng, 30) for _ in range(8)] for i in range(10)}
    near = list(base["d03"])
    near[2] = near[2].replace(near[2].split()[5], "changed", 1)
    near[6] = near[6] + " and one more"
    dialogues = [{"dialogue_id": d, "persona_id": f"p{i % 6}", "texts": t}
                 for i, (d, t) in enumerate(base.items())]
    dialogues += [
        {"dialogue_id": "d90-exact", "persona_id": "p5", "texts": [t.upper() for t in base["d01"]]},
        {"dialogue_id": "d91-near", "persona_id": "p4", "texts": near},
    ]
    if not scrambled:
        write_run(path, personas, dialogues)
        return path
    # The same run as two uncompacted batches whose turns interleave: the bucketed reader.
    sorted_run = open_run(write_run(path.with_name(path.name + "-sorted"), personas, dialogues))
    schema = load_schema(None)
    store = RunStore(path)
    store.create()
    store.set_persona_fields(schema.field_names, schema.integer_fields())
    turns = sorted_run.table("turns").to_pylist()
    rng.shuffle(turns)
    store.write_batch("a", {"personas": sorted_run.table("personas").to_pylist(),
                            "dialogues": sorted_run.table("dialogues").to_pylist(),
                            "turns": turns[: len(turns) // 2]})
    store.write_batch("b", {"turns": turns[len(turns) // 2 :]})
    store.write_json("manifest.json", {"kind": "synthetic", "status": "complete"})
    return path


@pytest.mark.parametrize("scrambled", [False, True])
def test_exact_and_near_duplicates_planted_in_a_run_are_found(tmp_path: Path, scrambled: bool) -> None:
    run = open_run(_dup_run(tmp_path / "run", scrambled=scrambled))
    assert is_grouped(turn_index(run)) is not scrambled
    rows = [(r.dialogue_id, r.kind, r.evidence) for r in scan_run(run).rows]
    near = [("d91-near", "near_duplicate", "d03")] if minhash_available() else []  # the export extra
    assert rows == [("d90-exact", "duplicate", "d01"), *near]


def test_without_datasketch_only_exact_duplicates_are_found_and_the_summary_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import spasm.export.qa as qa

    monkeypatch.setattr(qa, "minhash_available", lambda: False)
    result = scan_run(open_run(_dup_run(tmp_path / "run")))
    assert [r.kind for r in result.rows] == ["duplicate"]
    assert result.summary.near_duplicates.startswith("not scanned (install datasketch")
    with pytest.raises(UserError, match="pip install 'spasm\\[export\\]'"):
        scan_run(open_run(tmp_path / "run"), near=True)


def test_streaming_yields_each_dialogue_once_in_turn_order(tmp_path: Path) -> None:
    grouped = open_run(_dup_run(tmp_path / "a"))
    scrambled = open_run(_dup_run(tmp_path / "b", scrambled=True))
    seen_a = dict(iter_dialogues(grouped, turn_index(grouped), bucket_rows=10))
    seen_b = dict(iter_dialogues(scrambled, turn_index(scrambled), bucket_rows=10))
    assert seen_a == seen_b and len(seen_a) == 12
    assert all([t.index for t in ts] == list(range(8)) for ts in seen_b.values())
    only = dict(iter_dialogues(scrambled, turn_index(scrambled), only={"d01", "d05"}))
    assert sorted(only) == ["d01", "d05"]


# --------------------------------------------------------------------------- role flips

def test_role_flips_come_from_eval_signals_and_annotations(tmp_path: Path) -> None:
    run_dir = _dup_run(tmp_path / "run")
    assert "no signals" in scan_run(open_run(run_dir)).summary.role_flips
    (run_dir / "eval").mkdir()
    signals = pd.DataFrame({"dialogue_id": ["d02", "d04"], "echoing": [True, False],
                            "echo_who": ["client", "none"], "echo_evidence": ["cue: you should", ""]})
    signals.to_parquet(run_dir / "eval" / "per_dialogue.parquet")
    when = pd.Timestamp("2026-01-01", tz="UTC").to_pydatetime()
    def label(i: int, dialogue: str, echoing: str | None, year: int = 2026, flip: bool | None = None
              ) -> AnnotationRow:
        return AnnotationRow(annotation_id=f"a{i}", dialogue_id=dialogue, annotator="ana", echoing=echoing,
                             role_flip=flip, labelled_at=when.replace(year=year))

    RunStore(run_dir).write_batch("ann", {"annotations": [
        label(1, "d06", "client"), label(2, "d07", "both"),
        label(3, "d07", "none", year=2027),  # a later label by the same annotator supersedes
        label(4, "d08", None, flip=True), label(5, "d09", "none", flip=False),
    ]})
    result = scan_run(open_run(run_dir))
    flips = [(r.dialogue_id, r.evidence) for r in result.rows if r.kind == "role_flip"]
    assert [d for d, _ in flips] == ["d02", "d06", "d08"]
    assert flips[0][1].startswith("eval: client echoes")
    assert result.summary.role_flips == "spasm eval + annotations"
    # An export drops them by default; --echoing keep keeps them, --echoing only keeps only them.
    unflagged = 7 if minhash_available() else 8  # d90 (exact) and d91 (near) are duplicates
    for echoing, kept in (("drop", unflagged), ("keep", unflagged + 3), ("only", 3)):
        options = ExportOptions(formats=["openai"], split=(1.0,), selection=Selection(echoing=echoing))
        stats = export_run(run_dir, tmp_path / echoing, options).stats
        assert stats.conversations == kept, echoing
    assert stats.dropped == {"echoing": 9}  # with "only", every unmarked dialogue


def test_harness_notes_copied_into_a_reply_are_found_and_keep_the_export_clean(tmp_path: Path) -> None:
    """The harness's private notes are a prompt a small model may copy: every fixed line of a
    real turn block (rendered by a level-C run) is found, ordinary talk is not, and an export
    drops a dialogue whose reply repeats them unless ``--allow-qa harness_notes`` keeps it."""
    run = tmp_path / "run"
    with TestServer() as srv:  # its replies quote the last message: here, the turn block
        config = config_from(endpoint_config(
            srv.base_url, personas={"n": 1}, dialogue={"max_turns_per_agent": 3, "max_tokens": 40},
            termination={"rules": False}, harness={"client": "C", "window": 2, "stride": 1},
        ))
        anyio.run(Engine(config, run, progress=False, sleep_scale=0).run)
    turns = pd.read_parquet(run / "turns.parquet")
    frames = [json.loads(m) for m in turns[turns.speaker == "client"].messages]
    block = frames[-1][-1]["content"]
    assert block.startswith("Private notes for your next message")
    fixed = [line for line in block.splitlines()
             if line.startswith(("Private notes", "Where you stand now:", "Scene:"))
             or line.startswith(("- This is message", "- Topic so far:", "- The conversation has"))]
    assert len(fixed) >= 4, block
    for line in fixed:
        if line == "Scene:":  # a heading alone says nothing a person could not
            continue
        assert scan_text(line, ScanContext(), kinds=["harness_notes"]), line
    for ordinary in ("This is my first message here.", "So far so good, thanks.",
                     "What is still open is my refund.", "The topic is my visa."):
        assert not scan_text(ordinary, ScanContext(), kinds=["harness_notes"]), ordinary
    qa = scan_run(open_run(run))
    assert any(r.kind == "harness_notes" for r in qa.rows)
    with pytest.raises(UserError):  # its one dialogue is dropped: nothing left to export
        export_run(run, tmp_path / "out", ExportOptions())
    kept = export_run(run, tmp_path / "kept",
                      ExportOptions(selection=Selection(allow_qa=["harness_notes"])))
    assert kept.stats.conversations == 1

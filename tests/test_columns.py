"""The JSON columns have one owner (spasm.dataset.columns): each model round-trips through real
Parquet, dumps the exact compact JSON stored runs hold (separators, key order, non-ASCII
kept), reads the older probe formats, and a malformed cell is reported as a FormatError naming
its column."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spasm.backends.base import ChatRequest, Completion
from spasm.cli import main
from spasm.dataset import CallRow, DialogueRow, RunStore, TurnRow, open_run
from spasm.dataset.columns import (
    CallParams,
    CheckerVerdict,
    Probe,
    StateLog,
    dump_params,
    dump_probes,
    dump_state,
    dump_verdict,
    load_params,
    load_probes,
    load_state,
    load_state_log,
    load_verdict,
)
from spasm.dataset.persona_rows import (
    ID_CARD_COLUMNS,
    PERSONA_HEAD,
    PERSONA_TAIL,
    SOURCE_COLUMN,
    cards_of,
    persona_of,
    persona_record,
    persona_row,
    persona_row_model,
)
from spasm.dataset.rows import JSON_COLUMNS, ROW_MODELS, arrow_schema
from spasm.errors import FormatError
from spasm.harness.checker import CheckerOutput, DimensionScores, screened_verdict, verdict_from
from spasm.harness.level_report import level_report
from spasm.harness.state import Change, StateUpdate, apply_update, initial_client_state
from spasm.harness.verify import verify
from spasm.personas.persona import Persona
from spasm.viewer.charts import harness_charts

RECENT = "You: Meine Waschmaschine ist wieder kaputt — schon wieder!\nThe agent: Das tut mir leid."
NOW = datetime(2024, 1, 1, tzinfo=UTC)


# -- values made by the real harness code --------------------------------------------------------


def _reduction() -> Any:
    """A reducer step with a clip and decays, on a state with non-ASCII text."""
    persona = Persona(id="p0", index=0, card="", fields={
        "emotion": "angry", "intensity": "severe", "concern": "die Waschmaschine (schon wieder)",
        "motivation": "wants a repair — today"})
    update = StateUpdate(changes=[Change(dimension="emotion.joy", value=95, evidence="kein Zitat")],
                         strategy="Ruhig bleiben, nach dem Termin fragen.", new_belief="Sie hören zu")
    return apply_update(initial_client_state(persona), update, RECENT)


def _draft(text: str) -> Any:
    from spasm.agents import Draft

    return Draft(text, Completion(text, 0, 0, "m"), [])


def _verified() -> tuple[dict[str, Any], dict[str, Any]]:
    """A verify-mode verdict (failed once, rewritten, passed) and an unchecked one."""
    failed = screened_verdict(["says or implies it is an AI"])
    passed = verdict_from(
        CheckerOutput(dimension_scores=DimensionScores(boundary=90, fact=80, state=70, style=60),
                      violations=["zu förmlich"], correction_advice="Kürzer, bitte."),
        [], pass_threshold=60, boundary_floor=50,
    )
    checks = iter([failed, passed])

    async def check(text: str, n: int) -> Any:
        return next(checks)

    async def unavailable(text: str, n: int) -> Any:
        return None

    async def redraft(note: str) -> Any:
        return _draft("Schon gut, wann kommt der Techniker?")

    rewritten = anyio.run(verify, _draft("As an AI I cannot say."), check, redraft)
    unchecked = anyio.run(verify, _draft("Hallo"), unavailable, redraft)
    return rewritten.verdict, unchecked.verdict


def _probes() -> list[dict[str, Any]]:
    """Probes as the recall hook records them: one answered, one whose call failed."""
    return [
        {"depth": 0.0, "index": 1, "partner_message": 1, "distance": 6, "in_window": False,
         "facts": ["waschmaschine", "kaputt"], "answer": "Die Waschmaschine ist kaputt.",
         "recall": 1.0},
        {"depth": 0.5, "index": 5, "partner_message": 3, "distance": 2, "in_window": True,
         "facts": ["techniker"], "answer": None, "recall": None, "error": "TimeoutBackendError"},
    ]


def _request() -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": "hi"},), temperature=0.7,
                       max_tokens=40, seed=3, json_schema={"type": "object"})


# -- bytes: the compact JSON stored runs hold -----------------------------------------------------


def test_each_dump_writes_the_bytes_spasm_wrote_before_the_models() -> None:
    r = _reduction()
    assert r.clips and r.decays
    assert dump_state(r.state) == r.state.to_json() == json.dumps(
        r.state.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))
    assert "Waschmaschine (schon wieder)" in dump_state(r.state)  # non-ASCII kept as is
    clip = ("dimension", "previous", "proposed", "applied", "reason")
    assert r.log() == json.dumps(
        {"clips": [{k: getattr(c, k) for k in clip} for c in r.clips],
         "decays": [{k: getattr(c, k) for k in clip} for c in r.decays],
         "fallback": False}, separators=(",", ":"))

    rewritten, unchecked = _verified()
    first, final = rewritten["checks"]
    legacy = {"mode": "verify", **{k: v for k, v in final.items()}, "pass": True,
              "checks": [first, final], "rewritten": True}
    assert dump_verdict(rewritten) == json.dumps(legacy, ensure_ascii=False)
    assert list(json.loads(dump_verdict(rewritten))) == [
        "mode", "pass", "overall_score", "dimension_scores", "violations", "correction_advice",
        "rule_violations", "boundary_violation", "source", "checks", "rewritten"]
    assert dump_verdict(unchecked) == json.dumps(
        {"mode": "verify", "pass": None, "fallback": True, "checks": [], "rewritten": False})
    audit = {"mode": "audit", **screened_verdict(["leer"]).as_dict()}
    assert dump_verdict(audit) == json.dumps(audit, ensure_ascii=False)
    audit_fallback = {"mode": "audit", "pass": None, "fallback": True}
    assert dump_verdict(audit_fallback) == json.dumps(audit_fallback)

    assert dump_probes(_probes()) == json.dumps({"probes": _probes()}, ensure_ascii=False)

    params = _request().params()
    assert dump_params(params) == json.dumps(params, sort_keys=True)
    # An integer temperature stays an integer: "0", not "0.0".
    assert dump_params({**params, "temperature": 0}) == json.dumps(
        {**params, "temperature": 0}, sort_keys=True)


# -- round trip through real Parquet -------------------------------------------------------------


def _dialogue(did: str, level: str) -> DialogueRow:
    return DialogueRow(
        dialogue_id=did, persona_id="p0", conversation_index=0, condition="ecp", pairing="a/b",
        client_backend="a", client_model="m", responder_backend="b", responder_model="m",
        seed=1, n_utterances=2, termination_reason="max_turns", harness_level=level,
    )


def _call(did: str, params: str) -> CallRow:
    return CallRow(call_id=f"x:{did}#1", dialogue_id=did, role="client", backend="a", model="m",
                   request_hash="h", params=params, attempt=1, outcome="ok", started_at=NOW)


def _write_run(run: Path, verdict: str) -> None:
    r = _reduction()
    turns = [
        TurnRow(dialogue_id="d1", turn_index=0, speaker="client", text="Hallo", state=dump_state(r.state),
                state_clips=len(r.clips), state_log=r.log(), checker_verdict=verdict),
        TurnRow(dialogue_id="d1", turn_index=1, speaker="responder", text="Guten Tag",
                probe=dump_probes(_probes())),
    ]
    store = RunStore(run)
    store.create()
    store.write_batch("000001", {"dialogues": [_dialogue("d1", "E")], "turns": turns,
                                 "calls": [_call("d1", dump_params(_request().params()))]})
    store.compact_all()


def test_each_model_round_trips_through_parquet(tmp_path: Path) -> None:
    rewritten, _ = _verified()
    _write_run(tmp_path, dump_verdict(rewritten))
    run = open_run(tmp_path)
    turns = run.df("turns").sort_values("turn_index")
    client, responder = turns.to_dict("records")

    r = _reduction()
    assert load_state(client["state"]) == r.state
    log = load_state_log(client["state_log"])
    assert log == StateLog(clips=r.clips, decays=r.decays, fallback=False)
    verdict = load_verdict(client["checker_verdict"])
    assert isinstance(verdict, CheckerVerdict)
    assert verdict.mode == "verify" and verdict.passed is True and verdict.rewritten is True
    assert verdict.checks is not None and [c.passed for c in verdict.checks] == [False, True]
    assert verdict.checks[0].source == "code" and verdict.violations == ["zu förmlich"]
    assert dump_verdict(verdict) == client["checker_verdict"]
    probes = load_probes(responder["probe"])
    assert [p.recall for p in probes] == [1.0, None] and probes[1].error == "TimeoutBackendError"
    assert dump_probes(probes) == responder["probe"]
    params = load_params(run.df("calls").params.iloc[0])
    assert params == CallParams(temperature=0.7, max_tokens=40, seed=3, structured=True)

    # Empty cells (a level-A turn) read as nothing, not as an error.
    assert load_state(responder["state"]) is None and load_verdict(None) is None
    assert load_state_log(float("nan")) is None and load_probes(client["probe"]) == []

    # The report and the viewer read the same models.
    report = level_report(tmp_path)
    assert report["levels"]["E"]["rewrite_rate"] == 0.5
    assert report["levels"]["E"]["recall_responder"] == 1.0
    assert report["failures"]["fail_rate_by_emotion"] == {"anger": 0.0}
    charts = harness_charts(turns.to_dict("records"))
    assert [c.title for c in charts["client"]][:2] == ["Emotions (Plutchik, 0-100)",
                                                      "Relation to the partner"]


def test_the_json_columns_are_string_columns_of_their_tables() -> None:
    for table, columns in JSON_COLUMNS.items():
        schema = arrow_schema(ROW_MODELS[table])
        for column in columns:
            assert schema.field(column).type == pa.string(), (table, column)


# -- older formats -------------------------------------------------------------------------------


def test_older_probe_formats_are_read() -> None:
    single = json.dumps({"opening_index": 1, "in_window": False, "facts": ["washer"],
                         "answer": "the washer", "recall": 1.0})
    [p] = load_probes(single, n_utterances=10)
    assert p == Probe(depth=0.0, index=1, partner_message=1, distance=8, in_window=False,
                      facts=["washer"], answer="the washer", recall=1.0)
    # The single probe whose call failed had no in_window.
    failed = json.dumps({"opening_index": 3, "facts": ["x"], "answer": None, "recall": None,
                         "error": "TimeoutBackendError"})
    [q] = load_probes(failed)
    assert q.index == 3 and q.distance is None and q.in_window is None and q.error
    # A plain list of probes is read like {"probes": [...]}.
    listed = [{"depth": 0.5, "index": 4, "recall": 0.5}]
    assert load_probes(json.dumps(listed)) == load_probes(json.dumps({"probes": listed}))


# -- malformed cells ------------------------------------------------------------------------------


@pytest.mark.parametrize(("load", "raw", "message"), [
    (load_state, "{not json", r"turns\.state is not valid JSON"),
    (load_state, '{"emotions": {"joy": "very"}}', r"turns\.state does not match .*emotions\.joy"),
    (load_state_log, '{"clips": [{"dimension": "emotion.joy"}]}', r"turns\.state_log .*clips\.0"),
    (load_verdict, '{"mode": "verify", "pass": true, "passs": 1}', r"turns\.checker_verdict .*passs"),
    (load_verdict, '{"pass": true}', r"turns\.checker_verdict .*mode"),
    (load_probes, '"just text"', r"turns\.probe does not match .*probes"),
    (load_probes, '{"probes": 3}', r"turns\.probe .*not a list"),
    (load_params, "[]", r"calls\.params does not match"),
    (load_params, 7, r"calls\.params holds a int, not JSON text"),
])
def test_a_malformed_cell_is_a_format_error_naming_its_column(load: Any, raw: object,
                                                             message: str) -> None:
    with pytest.raises(FormatError, match=message):
        load(raw)


def test_a_writer_cannot_store_a_misspelled_key() -> None:
    with pytest.raises(FormatError, match="rewriten"):
        dump_verdict({"mode": "verify", "pass": True, "rewriten": True})
    with pytest.raises(FormatError, match="recal"):
        dump_probes([{"depth": 0.0, "recal": 1.0}])
    with pytest.raises(FormatError, match="temperature"):
        dump_params({"max_tokens": 4})


def test_a_malformed_column_stops_the_report_with_a_message_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_run(tmp_path, '{"mode": "verify", "pass": tru')
    with pytest.raises(FormatError, match=r"turns\.checker_verdict is not valid JSON"):
        level_report(tmp_path)
    assert main(["harness-report", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "turns.checker_verdict is not valid JSON" in err and "Traceback" not in err
    # The viewer still draws the turn and its charts, without the verdict it cannot read.
    turns = pd.read_parquet(tmp_path / "turns.parquet").to_dict("records")
    assert harness_charts([{**t, "state": "{oops"} for t in turns]) == {}


# -- Persona --------------------------------------------------------------------------------------


def test_persona_declares_the_fixed_columns_of_the_personas_table() -> None:
    # Every attribute but ``fields`` (the schema's columns) is a fixed column, in table order;
    # source_id: the personas table's last column in runs whose personas come from a file.
    columns = [a.metadata["column"] for a in dataclasses.fields(Persona)]
    at = columns.index(None)
    assert columns[:at] == list(PERSONA_HEAD)
    assert columns[at + 1:] == [*PERSONA_TAIL, *SOURCE_COLUMN]
    assert dataclasses.fields(Persona)[at].name == "fields"
    assert list(PERSONA_HEAD) == ["persona_id", "persona_index", "seed"]
    assert list(SOURCE_COLUMN) == ["source_id"]


def test_a_record_becomes_a_persona_only_with_an_id_a_card_and_an_index() -> None:
    record: dict[Any, Any] = {"persona_id": "p0", "persona_index": 0, "card": "You are Ana.",
                              "concern": "rent", "language": "es"}
    persona = persona_of(record)
    assert (persona.id, persona.index, persona.card) == ("p0", 0, "You are Ana.")
    assert persona.fields == {"concern": "rent", "language": "es"}
    assert persona.language == "es" and persona.policy is None
    with pytest.raises(FormatError, match="card"):
        persona_of({"persona_id": "p0", "persona_index": 0, "concern": "rent"})
    with pytest.raises(FormatError, match="persona_index"):
        persona_of({"persona_id": "p0", "card": "You are Ana."})
    # A table without the index (not one spasm wrote): the record's place stands for it.
    assert persona_of({"persona_id": "p0", "card": "You are Ana.", "persona_index": None},
                      place=3).index == 3
    # A table another tool wrote may hold only persona_id: the evaluation's reading of it
    # gives such a persona the card "" (no card), and keeps a card the record has.
    bare = persona_of({"persona_id": "p0", "concern": float("nan")}, place=1, card="")
    assert (bare.card, bare.index, list(bare.fields)) == ("", 1, ["concern"])
    assert persona_of(record, card="").card == "You are Ana."
    with pytest.raises(FormatError, match="persona_index 'first' is not an integer"):
        persona_of({**record, "persona_index": "first"})
    # The public reader's dict: the record as stored, checked for an id and a card only.
    assert persona_row({"persona_id": "p0", "card": "x"}) == {"persona_id": "p0", "card": "x"}
    with pytest.raises(FormatError, match="card"):
        persona_row({"persona_id": "p0"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        persona.card = "x"  # type: ignore[misc]


def test_the_cards_are_read_column_wise_by_id() -> None:
    table = pa.table({"persona_id": ["p0", "p1"], "persona_index": [0, 1],
                      "card": ["You are Ana.", None], "concern": ["rent", "bills"]})
    assert ID_CARD_COLUMNS == ("persona_id", "card")
    assert cards_of(table) == {"p0": "You are Ana.", "p1": None}
    assert cards_of(table.select(list(ID_CARD_COLUMNS))) == cards_of(table)


def test_a_persona_round_trips_through_the_personas_table(tmp_path: Path) -> None:
    # The record a persona is written as is the row the table holds, column for column.
    model = persona_row_model(["first_name", "age"], {"age"}, source=True)
    persona = Persona(id="p0000-ab", index=0, seed=7, fields={"first_name": "Ana", "age": 41},
                      card="You are Ana.", verdicts="[]", schema_name="s", schema_version="1",
                      policy="{}", policy_version="2", source_fields='{"n": 1}', source_id="r1")
    record = persona_record(persona)
    assert list(record) == list(model.model_fields)
    table = pa.Table.from_pylist([model(**record).as_record()], schema=arrow_schema(model))
    pq.write_table(table, tmp_path / "personas.parquet")
    (back,) = pq.read_table(tmp_path / "personas.parquet").to_pylist()
    assert persona_of(back) == persona
    # Without a policy or a data file, the record leaves those columns out, as the persona
    # stage always built it (a shard's manifest hashes these records).
    plain = persona_record(dataclasses.replace(persona, policy=None, policy_version=None,
                                               source_fields=None, source_id=None))
    assert list(plain)[-3:] == ["verdicts", "schema_name", "schema_version"]

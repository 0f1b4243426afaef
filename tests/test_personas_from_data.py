"""Personas from data: CSV, JSONL, Parquet and a ``datasets`` directory read
into the same personas table; field_map, cards, descriptions, the drift dimensions extracted
once through the caller, source ids, the schema's rules, seeded sampling, and bad rows as clear
errors or rejections with reasons. The end-to-end test runs a CSV of 3 personas through
``spasm generate`` on the test server and reads the tables back with pandas."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from spasm.cli import main
from spasm.config import parse_config
from spasm.dataset.persona_rows import persona_row_model, rejection_row_model
from spasm.dataset.rows import SCHEMA_VERSION
from spasm.errors import ConfigError, UserError
from spasm.personas import load_schema
from spasm.personas.sources import load_source
from spasm.testing import TestServer
from tests.conftest import endpoint_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "configs" / "examples" / "personas.csv"

CSV = """id,first_name,age,occupation,concern,emotion,motivation,card,description
a1,Aisha,34,Nurse,a charge I do not recognise,anxious,wants it reversed,,
a2,,,,,,,"You are Mei, a barista whose phone bill doubled this month.",
a3,,,,,,,,"A retired teacher moving a savings account into her own name."
"""
#: The same three personas, as records (JSON types: the age is a number).
RECORDS: list[dict[str, Any]] = [
    {"id": "a1", "first_name": "Aisha", "age": 34, "occupation": "Nurse",
     "concern": "a charge I do not recognise", "emotion": "anxious",
     "motivation": "wants it reversed"},
    {"id": "a2", "card": "You are Mei, a barista whose phone bill doubled this month."},
    {"id": "a3", "description": "A retired teacher moving a savings account into her own name."},
]
#: As a table: every column in every row (Arrow infers the columns from the first row).
COLUMNS = list(dict.fromkeys(k for r in RECORDS for k in r))
TABLE = pa.Table.from_pylist([{k: r.get(k) for k in COLUMNS} for r in RECORDS])


def _schema() -> Any:
    return load_schema(None)


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    return path


def _summary(path: Path, **kwargs: Any) -> list[tuple[str, str, str, dict[str, Any]]]:
    source = load_source(path, _schema(), **kwargs)
    return [(c.source_id, c.card_source, c.card,
             {k: v for k, v in c.fields.items() if v is not None}) for c in source.accepted]


# -- the formats -------------------------------------------------------------------------------
def test_csv_jsonl_parquet_and_a_datasets_directory_give_the_same_personas(tmp_path: Path) -> None:
    csv_rows = _summary(_write(tmp_path / "p.csv", CSV))
    jsonl = _write(tmp_path / "p.jsonl", "".join(json.dumps(r) + "\n" for r in RECORDS))
    parquet = tmp_path / "p.parquet"
    pq.write_table(TABLE, parquet)
    assert _summary(jsonl) == csv_rows
    assert _summary(parquet) == csv_rows
    assert [r[:2] for r in csv_rows] == [("a1", "template"), ("a2", "source"), ("a3", "description")]
    assert csv_rows[0][3]["age"] == 34  # an integer field, from CSV text too
    assert csv_rows[2][2] == ("You are this person: A retired teacher moving a savings account "
                              "into her own name.")
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset(TABLE).save_to_disk(str(saved))
    assert _summary(saved) == csv_rows  # read with pyarrow, not datasets
    assert datasets.load_from_disk(str(saved)).to_list() == TABLE.to_pylist()
    splits = tmp_path / "splits"
    datasets.DatasetDict({"train": datasets.Dataset(TABLE)}).save_to_disk(str(splits))
    with pytest.raises(UserError, match=r"several splits.*train"):
        load_source(splits, _schema())
    assert _summary(splits / "train") == csv_rows


def test_field_map_renames_columns_and_the_row_position_is_the_id_without_an_id_column(
        tmp_path: Path) -> None:
    path = _write(tmp_path / "p.csv", "Job Title,Years,persona\nNurse,41,A nurse on night shifts\n")
    rows = _summary(path, field_map={"job title": "occupation", "Years": "age"})
    assert rows == [("0", "description", "You are this person: A nurse on night shifts",
                     {"occupation": "Nurse", "age": 41})]
    with pytest.raises(UserError, match="field_map names column 'salary'"):
        load_source(path, _schema(), field_map={"salary": "occupation"})
    with pytest.raises(UserError, match="no field of the persona schema"):
        load_source(path, _schema(), field_map={"Years": "years"})
    with pytest.raises(UserError, match="no column is a card, a description or a persona field"):
        load_source(_write(tmp_path / "q.csv", "x,y\n1,2\n"), _schema())


def test_the_schema_rules_reject_rows_with_reasons_and_sampling_is_seeded(tmp_path: Path) -> None:
    lines = ["id,first_name,age,occupation"] + [f"r{i},N{i},{30 + i},Nurse" for i in range(10)]
    lines.append("old,Sam,24,Retiree")  # the bundled schema's retiree-age rule
    path = _write(tmp_path / "p.csv", "\n".join(lines) + "\n")
    source = load_source(path, _schema())
    assert len(source.accepted) == 10
    (rejected,) = source.rejected
    assert rejected["stage"] == "rules" and rejected["source_id"] == "old"
    assert json.loads(rejected["reasons"])[0].startswith(f"{path}:12: retiree-age")
    a = [c.source_id for c in source.sample(4, seed=1)]
    assert a == [c.source_id for c in source.sample(4, seed=1)]
    assert a == sorted(a, key=lambda s: int(s[1:]))  # drawn rows keep the file's order
    assert {tuple(c.source_id for c in source.sample(4, seed=s)) for s in range(6)} != {tuple(a)}
    assert len(source.sample(None, seed=1)) == 10
    with pytest.raises(UserError, match="10 usable row"):
        source.sample(11, seed=1)


# -- bad rows: a clear error naming file, line and column, or a rejection with its reason --------
def test_bad_rows_are_errors_naming_line_and_column_or_rejections_with_reasons(tmp_path: Path) -> None:
    schema = _schema()
    bad = _write(tmp_path / "enc.csv", b"id,city\na1,Leeds\na2,Gda\xf1sk\n")
    with pytest.raises(UserError, match=r"enc.csv:3, column 'city': not UTF-8"):
        load_source(bad, schema)
    ragged = _write(tmp_path / "ragged.csv", "id,city\na1,Leeds,UK\n")
    with pytest.raises(UserError, match=r"ragged.csv:2: the row has 3 cell\(s\)"):
        load_source(ragged, schema)
    dup_ids = _write(tmp_path / "dup.csv", "id,city\na1,Leeds\na1,York\n")
    with pytest.raises(UserError, match=r"dup.csv:3: the id \"a1\" repeats .*dup.csv:2"):
        load_source(dup_ids, schema)
    dup_cols = _write(tmp_path / "cols.csv", "city,City\nLeeds,York\n")
    with pytest.raises(UserError, match="same name"):
        load_source(dup_cols, schema)
    broken = _write(tmp_path / "p.jsonl", '{"id": "a", "city": "Leeds"}\n{"id": "b",\n')
    with pytest.raises(UserError, match=r"p.jsonl:2: not valid JSON"):
        load_source(broken, schema)
    with pytest.raises(UserError, match="cannot tell the format"):
        load_source(_write(tmp_path / "p.txt", "x"), schema)
    mixed = _write(tmp_path / "m.jsonl", "\n".join(json.dumps(r) for r in [
        {"id": "ok", "city": "Leeds"},
        {"id": "age", "city": "York", "age": "forty"},
        {"id": "obj", "city": {"name": "Hull"}},
        {"id": "empty", "city": ""},
        {"id": "again", "city": "Leeds"},
        {"city": "Bath"},
    ]) + "\n")
    source = load_source(mixed, schema)
    assert [c.source_id for c in source.accepted] == ["ok"]
    reasons = {r["source_id"]: (r["stage"], json.loads(r["reasons"])[0]) for r in source.rejected}
    assert reasons["age"] == ("source", f"{mixed}:2, column 'age': \"forty\" is not an integer "
                                        "(age is an integer field)")
    assert reasons["obj"][1].startswith(f"{mixed}:3, column 'city': ") and "not text" in reasons["obj"][1]
    assert "no card, description or persona field" in reasons["empty"][1]
    assert reasons["again"] == ("duplicate", f"{mixed}:5: the same card and fields as {mixed}:1")
    assert "no id" in reasons["5"][1]
    with pytest.raises(UserError, match="none of its 1 row"):
        load_source(_write(tmp_path / "none.csv", "id,age\na,old\n"), schema)


def test_the_config_checks_its_persona_source_settings() -> None:
    assert parse_config({}).personas.n == 4  # sampled personas keep their default
    assert parse_config({"personas": {"source": "p.csv"}}).personas.n is None  # every row
    with pytest.raises(ConfigError, match=r"field_map renames the columns of personas\.source"):
        parse_config({"personas": {"field_map": {"a": "age"}}})
    with pytest.raises(ConfigError, match="used as written"):
        parse_config({"personas": {"source": "p.csv", "llm_craft": True}})
    # Runs written before personas.source keep their fingerprint (a resume still matches).
    plain = parse_config({"seed": 3})
    data = plain.redacted()
    assert "source" in data["personas"] and plain.fingerprint() == parse_config(
        {"seed": 3, "personas": {"n": 4}}).fingerprint()


def test_the_source_id_column_is_only_in_runs_with_a_source() -> None:
    schema = _schema()
    plain = persona_row_model(schema.field_names, schema.integer_fields())
    sourced = persona_row_model(schema.field_names, schema.integer_fields(), source=True)
    assert "source_id" not in plain.model_fields
    assert list(sourced.model_fields)[-1] == "source_id"
    assert list(rejection_row_model([], set(), source=True).model_fields)[-1] == "source_id"
    doc = (ROOT / "docs" / "format.md").read_text(encoding="utf-8")
    assert "| 1.5 |" in doc and "`personas.source_id`" in doc


# -- the commands ------------------------------------------------------------------------------
def test_spasm_personas_from_previews_and_writes_parquet(tmp_path: Path, capsys: Any) -> None:
    assert main(["personas", "--from", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "4 row(s), 4 usable, 0 rejected" in out and "column 'id' → source_id" in out
    assert "lack a drift dimension" in out
    target = tmp_path / "p.parquet"
    assert main(["personas", "--from", str(EXAMPLE), "--n", "2", "--seed", "5",
                 "--out", str(target)]) == 0
    frame = pd.read_parquet(target)
    assert len(frame) == 2 and frame["source_id"].str.startswith("cs-").all()
    assert pd.read_parquet(tmp_path / "p.rejected.parquet").empty
    assert main(["personas", "--from", str(tmp_path / "missing.csv")]) == 2
    assert main(["personas", "--from", str(EXAMPLE), "--field-map", "nonsense"]) == 2
    assert main(["personas"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error: ") == 3


@pytest.mark.e2e
def test_a_csv_of_three_personas_runs_through_generate_export_and_eval(tmp_path: Path) -> None:
    csv = _write(tmp_path / "people.csv", CSV + "a4,Sam,24,Retiree,my pension,calm,wants info,,\n")
    run = tmp_path / "run"
    with TestServer() as srv:
        config = _write(tmp_path / "c.yaml", yaml.safe_dump(endpoint_config(srv.base_url)))
        args = ["generate", "--config", str(config), "--personas-from", str(csv), "--out", str(run),
                "--no-progress"]
        assert main(args) == 0
        calls = pd.read_parquet(run / "calls.parquet")
        assert main(args) == 0  # a rerun resumes: nothing is asked again
        assert len(pd.read_parquet(run / "calls.parquet")) == len(calls)
    personas = pd.read_parquet(run / "personas.parquet").set_index("source_id")
    assert list(personas.index) == ["a1", "a2", "a3"]
    assert list(personas["card_source"]) == ["template", "source", "description"]
    assert personas.loc["a1", "emotion"] == "anxious"  # from its column: nothing extracted
    for sid in ("a2", "a3"):  # free text: extracted once, stored, logged
        assert all(isinstance(personas.loc[sid, d], str) for d in ("concern", "emotion", "motivation"))
        assert json.loads(personas.loc[sid, "verdicts"])[-1]["stage"] == "extract"
    assert json.loads(personas.loc["a3", "persona_fields"])["description"].startswith("A retired")
    extract = calls[calls["role"] == "extract"]
    assert sorted(extract["persona_id"]) == sorted(personas.loc[["a2", "a3"], "persona_id"])
    rejected = pd.read_parquet(run / "persona_rejections.parquet")
    assert list(rejected["source_id"]) == ["a4"] and "retiree-age" in rejected["reasons"][0]
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    assert len(dialogues) == 3 and set(dialogues["persona_id"]) == set(personas["persona_id"])
    turns = pd.read_parquet(run / "turns.parquet")
    assert set(turns["dialogue_id"]) == set(dialogues["dialogue_id"])
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["schema_version"] == SCHEMA_VERSION
    assert main(["export", str(run), "--out", str(tmp_path / "export")]) == 0
    assert main(["eval", str(run), "--no-progress"]) == 0
    assert json.loads((run / "eval" / "metrics.json").read_text())


# -- fuzzing, as tests/test_fuzz_inputs.py does for the configs ------------------------------------
_SCALARS: list[Any] = [None, True, 0, -1, 10**30, 3.5, float("nan"), "", "x" * 300, "../../etc",
                       [], {}, [1, "a"], {"k": [None]}]


def _cases(kind: str, n: int) -> list[bytes]:
    rng = random.Random(f"fuzz-personas-{kind}")
    seed = EXAMPLE.read_bytes() if kind == "csv" else "".join(
        json.dumps(r) + "\n" for r in RECORDS).encode()
    out: list[bytes] = [b"", b"\x00" * 64, b"\xff\xfe\x00garbage", seed[: len(seed) // 2]]
    for i in range(n):
        pick = i % 3
        if pick == 0:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 400))))
        elif pick == 1:
            out.append(seed[: rng.randint(1, len(seed))])
        elif kind == "csv":
            lines = seed.decode().splitlines()
            row = rng.randrange(len(lines))
            cells = lines[row].split(",")
            cells[rng.randrange(len(cells))] = rng.choice(
                ['"', "", "a,b", "\x00", "é", "999999999999999999999"])
            lines[row] = ",".join(cells)
            out.append(("\n".join(lines) + "\n").encode())
        else:
            record = dict(rng.choice(RECORDS))
            record[rng.choice([*record, "age", "card"])] = rng.choice(_SCALARS)
            out.append((json.dumps(record, allow_nan=True) + "\n").encode())
    return out


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_bad_persona_files_give_exit_2_and_a_message_and_write_nothing(
        kind: str, tmp_path: Path, capsys: Any) -> None:
    outcomes: dict[int, int] = {}
    for i, content in enumerate(_cases(kind, 30)):
        case = tmp_path / f"case{i}"
        case.mkdir()
        path = _write(case / f"input.{kind}", content)
        code = main(["personas", "--from", str(path), "--out", str(case / "out" / "p.parquet")])
        err = capsys.readouterr().err
        assert code in (0, 2), (kind, i, code, content[:200], err)
        assert "Traceback" not in err
        if code == 2:
            assert err.startswith("error: "), (kind, i, err)
            assert not (case / "out").exists(), (kind, i)
        outcomes[code] = outcomes.get(code, 0) + 1
    assert outcomes.get(2, 0) >= 10 and outcomes.get(0, 0) >= 1

"""Persona schema, seeded sampler, declarative validator, crafter."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import anyio
import pandas as pd
import pytest
import yaml

from spasm.dataset.persona_rows import persona_record
from spasm.errors import ConfigError
from spasm.persona_stage import build_personas
from spasm.personas import load_schema, render_persona_card, rule_violations
from spasm.personas.sampler import sample_candidate
from spasm.personas.schema import ChoiceField

SCHEMA = load_schema()


def _values(field: str) -> list[str]:
    spec = SCHEMA.fields[field]
    assert isinstance(spec, ChoiceField)
    return [c.value for c in spec.values]


def test_bundled_schema_has_the_full_pools() -> None:
    assert len(_values("occupation")) >= 76
    assert len(_values("city")) >= 50
    assert len(_values("domain")) >= 44
    assert len(_values("emotion")) == 12
    assert _values("intensity") == ["mild", "moderate", "severe"]
    for dim in ("verbosity", "directness", "cooperativeness", "formality"):
        assert len(_values(dim)) >= 3
    age = SCHEMA.fields["age"]
    assert (age.min, age.max) == (18, 65)  # type: ignore[union-attr]
    assert {"concern", "motivation", "emotion"} <= set(SCHEMA.fields)


def _build(n: int, seed: int, schema=SCHEMA):  # type: ignore[no-untyped-def]
    return anyio.run(lambda: build_personas(schema, n, seed))


@pytest.mark.e2e
def test_same_seed_same_personas_in_a_fresh_process() -> None:
    here = _build(5, 123).accepted
    code = (
        "import anyio, json; from spasm.persona_stage import build_personas;"
        "from spasm.personas import load_schema;"
        "from spasm.dataset.persona_rows import persona_record;"
        "r = anyio.run(lambda: build_personas(load_schema(), 5, 123));"
        "print(json.dumps([persona_record(p) for p in r.accepted]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import json

    there = json.loads(out.stdout)
    assert [persona_record(p) for p in here] == there
    assert _build(5, 124).accepted[0].id != here[0].id


def test_rules_reject_the_incoherent_cases() -> None:
    base = sample_candidate(SCHEMA, random.Random(0))
    student_pension = {**base, "occupation": "University student", "age": 18,
                       "domain": "pension payout options"}
    reasons = rule_violations(SCHEMA, student_pension)
    assert any(r.startswith("pension-payout-age") for r in reasons)
    assert any(r.startswith("student-no-pension") for r in reasons)
    young_retiree = {**base, "occupation": "Retiree", "age": 24, "domain": "retirement savings"}
    assert any(r.startswith("retiree-age") for r in rule_violations(SCHEMA, young_retiree))
    fine = {**base, "occupation": "Retiree", "age": 63, "domain": "retirement savings"}
    assert not any(r.startswith("retiree-age") for r in rule_violations(SCHEMA, fine))


def test_accepted_personas_pass_and_rejections_keep_reasons() -> None:
    result = _build(40, 3)
    assert len(result.accepted) == 40
    for p in result.accepted:
        assert rule_violations(SCHEMA, dict(p.fields)) == []
        assert 18 <= p.fields["age"] <= 65
    assert result.rejected, "with 40 draws some candidates should fail a rule"
    for r in result.rejected:
        assert r["stage"] == "rules" and r["reasons"] != "[]"


def test_schema_whose_rules_reject_everything(tmp_path: Path) -> None:
    data = yaml.safe_load(Path("schemas/persona.yaml").read_text())
    data["rules"].append({"id": "nobody", "description": "Nobody passes.",
                          "when": {}, "require": {"age": {"max": 10}}})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="reject nearly everything"):
        _build(3, 0, load_schema(path))


def test_schema_errors_name_the_problem(tmp_path: Path) -> None:
    data = yaml.safe_load(Path("schemas/persona.yaml").read_text())
    data["rules"].append({"id": "typo", "description": "x", "when": {"ocupation": {"in": ["x"]}},
                          "require": {"age": {"min": 1}}})
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="ocupation"):
        load_schema(path)


def test_card_carries_the_fields() -> None:
    p = _build(1, 9).accepted[0]
    card = render_persona_card(dict(p.fields))
    assert card == p.card
    for key in ("first_name", "occupation", "city", "domain", "concern", "emotion"):
        value = str(p.fields[key])
        assert value.lower() in card.lower(), key
    assert str(p.fields["age"]) in card
    assert "AI" not in card.split()


def test_personas_command_writes_tables(tmp_path: Path) -> None:
    from spasm.cli import main

    out = tmp_path / "p.parquet"
    assert main(["personas", "--n", "6", "--out", str(out), "--seed", "5"]) == 0
    df = pd.read_parquet(out)
    assert len(df) == 6 and df.persona_id.is_unique
    assert {"persona_id", "age", "occupation", "city", "domain", "concern", "motivation",
            "emotion", "intensity", "verbosity", "directness", "cooperativeness", "formality",
            "card"} <= set(df.columns)
    rejected = pd.read_parquet(tmp_path / "p.rejected.parquet")
    assert "reasons" in rejected.columns

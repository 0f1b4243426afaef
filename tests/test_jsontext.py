"""spasm.jsontext: the one JSON reader of the importer, personas from data files and scenario
files tells a syntax error (with its place), Python's limits and a non-object apart."""

from __future__ import annotations

import pytest

from spasm.jsontext import LIMITS, JSONProblem, read_json, read_json_object


def test_a_value_and_an_object_are_read() -> None:
    assert read_json('[1, "a"]') == [1, "a"]
    assert read_json_object('{"a": {"b": 2}}') == {"a": {"b": 2}}


def test_a_syntax_error_names_its_line_and_column() -> None:
    with pytest.raises(JSONProblem) as caught:
        read_json_object('{\n  "a": 1,\n  "b" 2\n}')
    problem = caught.value
    assert (problem.kind, problem.line, problem.column) == ("syntax", 3, 7)
    assert problem.reason == "not valid JSON (Expecting ':' delimiter)"


@pytest.mark.parametrize("text", ["1" * 5000, "[" * 100_000 + "]" * 100_000])
def test_pythons_limits_are_not_a_syntax_error(text: str) -> None:
    with pytest.raises(JSONProblem) as caught:
        read_json(text)
    assert caught.value.kind == "limits" and caught.value.reason == LIMITS


def test_another_value_is_not_an_object() -> None:
    assert read_json("[]") == []
    with pytest.raises(JSONProblem) as caught:
        read_json_object("[]")
    assert caught.value.kind == "not_object" and caught.value.reason == "not a JSON object"

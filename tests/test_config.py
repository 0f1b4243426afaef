"""Config validation: typos are errors that name the field and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from spasm.config import load_config, parse_config
from spasm.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_bundled_configs_validate() -> None:
    paths = sorted(CONFIGS.glob("*.yaml"))
    assert paths, f"no bundled config found in {CONFIGS}: nothing would be checked"
    for path in paths:
        load_config(path)


def test_unknown_key_names_field_and_file(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("name: x\npersonas:\n  n: 2\n  colour: red\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert "personas.colour" in str(exc.value) and str(p) in str(exc.value)


def test_key_value_instead_of_env_var_name() -> None:
    with pytest.raises(ConfigError, match="NAME of an environment variable"):
        parse_config({"backends": {"x": {"base_url": "http://h/v1", "model": "m",
                                          "api_key_env": "sk-abc-123.def"}},
                      "pairings": [{"client": "x", "responder": "x"}]})


def test_pairing_must_name_a_backend() -> None:
    with pytest.raises(ConfigError, match="pairings names backend 'nope'"):
        parse_config({"pairings": [{"client": "embedded", "responder": "nope"}]})


def test_grid_pairings_and_bounds() -> None:
    cfg = parse_config({"backends": {"a": {"kind": "embedded"}, "b": {"kind": "embedded"}},
                        "pairings": "grid"})
    assert [p.label for p in cfg.pairing_list] == ["a/a", "a/b", "b/a", "b/b"]
    with pytest.raises(ConfigError, match=r"temperatures\.client"):
        parse_config({"backends": {"embedded": {"kind": "embedded",
                                                "temperatures": {"client": 3}}}})
    with pytest.raises(ConfigError, match="unknown condition"):
        parse_config({"conditions": ["ecp", "mirror"]})

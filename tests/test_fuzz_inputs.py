"""Fuzzing every command that reads a user's file: random bytes, truncated files and
random or mutated YAML/JSON must end in exit 0 or 2 with a message — never a traceback — and an
exit 2 writes nothing."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from spasm.cli import main

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
SEED_FILES = {
    "config": (ROOT / "configs" / "smoke.yaml").read_bytes(),
    "schema": (ROOT / "schemas" / "persona.yaml").read_bytes(),
    "import": (ROOT / "tests" / "data" / "spasm_release_sample.jsonl").read_bytes(),
    # A config with a python backend (your agent as the Responder: kind, target, deterministic).
    "python": (ROOT / "configs" / "examples" / "python-responder.yaml").read_bytes(),
}
_SCALARS: list[Any] = [None, True, 0, -1, 10**12, 3.5, float("nan"), "", "x" * 300, "../../etc",
                       "0000-00-00", [], {}, [1, "a"], {"k": [None]}]


def _mutate(data: Any, rng: random.Random) -> Any:
    """Replace one random leaf (or key) of a parsed document with a random value."""
    data = copy.deepcopy(data)
    node, parent, key = data, None, None
    for _ in range(rng.randint(1, 6)):
        if isinstance(node, dict) and node:
            parent, key = node, rng.choice(list(node))
            node = node[key]
        elif isinstance(node, list) and node:
            parent, key = node, rng.randrange(len(node))
            node = node[key]
        else:
            break
    value = rng.choice(_SCALARS)
    if parent is None:
        return value
    if isinstance(parent, dict) and rng.random() < 0.2:
        parent[f"{key}_typo"] = parent.pop(key)
    else:
        parent[key] = value
    return data


def _cases(kind: str, n: int) -> list[bytes]:
    rng = random.Random(f"fuzz-{kind}")
    seed = SEED_FILES[kind]
    out: list[bytes] = [b"", b"\x00" * 64, b"\xff\xfe\x00garbage", seed[: len(seed) // 2]]
    for i in range(n):
        pick = i % 4
        if pick == 0:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 400))))
        elif pick == 1:
            out.append(seed[: rng.randint(1, len(seed))])
        elif kind == "import":
            lines = seed.decode().splitlines()
            records = [json.loads(line) for line in lines]
            line = json.dumps(_mutate(rng.choice(records), rng), allow_nan=True)
            out.append((line + "\n").encode())
        else:
            doc = yaml.safe_load(seed)
            dumped = yaml.safe_dump(_mutate(doc, rng), allow_unicode=True)
            out.append(dumped.encode() if pick == 2 else json.dumps(yaml.safe_load(dumped)).encode())
    return out


def _commands(tmp: Path, path: Path) -> dict[str, list[str]]:
    return {
        "config": ["generate", "--config", str(path), "--out", str(tmp / "out"), "--dry-run",
                   "--no-progress"],
        "schema": ["personas", "--n", "2", "--schema", str(path), "--out", str(tmp / "out" / "p.parquet")],
        "import": ["import", str(path), "--out", str(tmp / "out")],
        "python": ["generate", "--config", str(path), "--out", str(tmp / "out"), "--dry-run",
                   "--no-progress"],
    }


@pytest.mark.parametrize("kind", ["config", "schema", "import", "python"])
def test_bad_files_give_exit_2_and_a_message_and_write_nothing(
    kind: str, tmp_path: Path, capsys: Any
) -> None:
    outcomes: dict[int, int] = {}
    for i, content in enumerate(_cases(kind, 36)):
        case = tmp_path / f"case{i}"
        case.mkdir()
        path = case / ("input.jsonl" if kind == "import" else "input.yaml")
        path.write_bytes(content)
        if kind == "schema":
            (case / "out").mkdir()
        args = _commands(case, path)[kind]
        code = main(args)
        err = capsys.readouterr().err
        assert code in (0, 2), (kind, i, code, content[:200], err)
        assert "Traceback" not in err
        if code == 2:
            assert err.startswith("error: "), (kind, i, err)
            written = [p for p in case.rglob("*") if p != path and p.name != "out"]
            assert not written, (kind, i, written)
        outcomes[code] = outcomes.get(code, 0) + 1
    assert outcomes.get(2, 0) >= 20  # the fuzz mostly produced bad input, as intended



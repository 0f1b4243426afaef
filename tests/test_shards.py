"""Deterministic shards (``spasm generate --shard I/N``) and their merge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spasm.cli import main
from spasm.config import parse_config
from spasm.dataset import open_run
from spasm.errors import UserError
from spasm.executors.shards import parallel_shards, share_limits
from spasm.runplan import Shard
from spasm.testing import TestServer
from tests.conftest import endpoint_config, make_persona

#: Columns that hold wall-clock facts, which differ between any two runs.
TIMING = ("latency_s", "started_at", "failed_at")
KEYS = {"personas": ["persona_index"], "persona_rejections": ["draw"],
        "dialogues": ["dialogue_id"], "turns": ["dialogue_id", "turn_index"]}
#: Every table's keys, a group run's participants too (for :func:`sorted_rows`).
ROW_KEYS = {**KEYS, "participants": ["dialogue_id", "position"]}


def config_file(tmp: Path, base_url: str, **overrides: Any) -> str:
    """A run config of 5 personas × 2 conversations × ECP and CONCAT against the server."""
    data = endpoint_config(base_url, **{"personas": {"n": 5}, "conversations_per_persona": 2,
                                        "conditions": ["ecp", "concat"], **overrides})
    path = tmp / f"run-{abs(hash(json.dumps(data, sort_keys=True))) % 10**8}.yaml"
    path.write_text(json.dumps(data))
    return str(path)


def generate(config: str, out: Path, *extra: str) -> int:
    return main(["generate", "--config", config, "--out", str(out), "--no-progress", *extra])


def sorted_rows(run_dir: Path, table: str) -> pd.DataFrame:
    """A table's rows sorted by its keys, without timing columns, for comparing runs."""
    df = open_run(run_dir).df(table)
    df = df[[c for c in df.columns if c not in TIMING]]
    return df.sort_values(ROW_KEYS[table]).reset_index(drop=True)


@pytest.mark.e2e
def test_three_shards_merged_equal_the_unsharded_run(tmp_path: Path, server: TestServer) -> None:
    cfg = config_file(tmp_path, server.base_url)
    assert generate(cfg, tmp_path / "whole") == 0
    shards = [tmp_path / f"shard{i}" for i in range(3)]
    for i, out in enumerate(shards):
        assert generate(cfg, out, "--shard", f"{i}/3") == 0
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "merged")]) == 0

    merged, whole = tmp_path / "merged", tmp_path / "whole"
    for table in KEYS:
        pd.testing.assert_frame_equal(sorted_rows(merged, table), sorted_rows(whole, table))
    assert len(sorted_rows(whole, "dialogues")) == 5 * 2 * 2
    # Each shard ran exactly its personas (index % 3), with all their dialogues.
    for i, out in enumerate(shards):
        personas = open_run(out).personas
        assert set(personas.persona_index % 3) == {i}
        assert set(open_run(out).dialogues.persona_id) == set(personas.persona_id)
    # The merged calls keep every shard's calls; the dialogue calls equal the unsharded run's.
    calls = open_run(merged).calls
    assert len(calls) == sum(len(open_run(s).calls) for s in shards)
    assert calls.call_id.is_unique
    per_dialogue = sorted(calls.dropna(subset=["dialogue_id"]).request_hash)
    assert per_dialogue == sorted(open_run(whole).calls.dropna(subset=["dialogue_id"]).request_hash)
    manifest = open_run(merged).manifest
    assert manifest["status"] == "complete" and "shard" not in manifest
    assert [m["shard"] for m in manifest["merged_from"]] == ["0/3", "1/3", "2/3"]
    assert manifest["counts"]["completed"] == 20


@pytest.mark.e2e
def test_a_shard_directory_resumes_only_as_the_same_shard(
    tmp_path: Path, server: TestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config_file(tmp_path, server.base_url)
    out = tmp_path / "s0"
    assert generate(cfg, out, "--shard", "0/2") == 0
    shard = open_run(out).manifest["shard"]
    assert (shard["spec"], shard["index"], shard["count"], shard["personas"]) == ("0/2", 0, 2, 5)
    assert len(shard["personas_sha256"]) == 64
    assert sorted(open_run(out).personas.persona_index) == [0, 2, 4]
    calls = len(open_run(out).calls)
    capsys.readouterr()

    assert generate(cfg, out, "--shard", "1/2") == 2
    assert "holds shard 0/2, so it cannot be resumed as shard 1/2" in capsys.readouterr().err
    assert generate(cfg, out) == 2
    assert "resume it with --shard 0/2" in capsys.readouterr().err
    assert generate(cfg, out, "--shard", "0/2") == 0  # the same shard: nothing left to do
    assert open_run(out).manifest["counts"]["new_this_pass"] == 0
    assert len(open_run(out).calls) == calls
    assert open_run(out).manifest["shard"] == shard

    assert generate(cfg, tmp_path / "whole") == 0
    capsys.readouterr()
    assert generate(cfg, tmp_path / "whole", "--shard", "0/2") == 2
    assert "holds an unsharded run" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["3/3", "x", "1/0", "-1/2"])
def test_a_shard_that_does_not_exist_is_refused(
    spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert generate(config_file(tmp_path, "http://127.0.0.1:9/v1"), tmp_path / "x", f"--shard={spec}") == 2
    assert "--shard" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_shards_partition_the_personas_round_robin() -> None:
    personas = [make_persona(f"p{i}", i) for i in range(11)]
    for n in range(1, 6):
        parts = [Shard(i, n).select(personas) for i in range(n)]
        ids = [p.id for part in parts for p in part]
        assert sorted(ids) == sorted(p.id for p in personas)  # each persona once
        assert max(map(len, parts)) - min(map(len, parts)) <= 1  # balanced
        assert all(Shard(i, n).select(part) == part for i, part in enumerate(parts))
    assert Shard.parse(" 2 / 5 ") == Shard(2, 5) and str(Shard(2, 5)) == "2/5"
    with pytest.raises(UserError):
        Shard(5, 5)


def test_limits_are_split_so_the_shards_add_up_to_the_run_limits() -> None:
    data = endpoint_config("http://127.0.0.1:9/v1", engine={"max_cost": 1.0, "max_tokens": 1000})
    data["backends"]["srv"].update(max_concurrency=10, rpm=100, tpm=10_000)
    config = parse_config(data, "<test>")
    assert parallel_shards(config, shards=8, slots=16) == 8
    assert parallel_shards(config, shards=40, slots=16) == 10  # each shard needs one slot
    shared = share_limits(config, ways=3, shards=6)
    b = shared.backends["srv"]
    assert (b.max_concurrency, b.rpm, b.tpm) == (3, 33, 3333)
    assert 3 * b.max_concurrency <= 10 and 3 * b.rpm <= 100 and 3 * b.tpm <= 10_000
    assert (shared.engine.max_cost, shared.engine.max_tokens) == (1.0 / 6, 166)
    # Limits are not part of what the data depends on: shards still resume and merge as one.
    assert shared.fingerprint() == config.fingerprint()

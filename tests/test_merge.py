"""``spasm merge`` refusals, and the streaming k-way merge behind it and the compaction."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spasm.cli import main
from spasm.dataset import open_run
from spasm.dataset.store import RunStore
from spasm.dataset.streaming import dedupe_sorted, merge_sorted, sort_rows, sorting_columns
from spasm.testing import TestServer
from tests.test_shards import config_file, generate


# -- the streaming merge ---------------------------------------------------------------------
def _random_parts(tmp: Path, rng: random.Random, n_parts: int) -> tuple[list[Path], list[pa.Table]]:
    """Parts with duplicate and null keys; some sorted and marked so, some not (as older
    spasm wrote them), one lacking a column (an older schema)."""
    paths, tables = [], []
    for i in range(n_parts):
        n = rng.randint(0, 120)
        key = [None if rng.random() < 0.05 else f"{rng.choice('abcé')}{rng.randint(0, 30):02d}"
               for _ in range(n)]
        table = pa.table({"k": pa.array(key, pa.string()),
                          "j": pa.array([rng.randint(0, 3) for _ in range(n)], pa.int32()),
                          "src": pa.array([i] * n, pa.int32()), "row": pa.array(range(n), pa.int32())})
        if i != 3:
            table = table.append_column("extra", pa.array([f"x{i}"] * n, pa.string()))
        path = tmp / f"part-{i:03d}.parquet"
        if i % 3:
            table = sort_rows(table, ["k", "j"])
            pq.write_table(table, path, sorting_columns=sorting_columns(table.schema, ["k", "j"]))
        else:
            pq.write_table(table, path)
        paths.append(path)
        tables.append(table)
    return paths, tables


@pytest.mark.parametrize("dedupe", [False, True])
def test_streaming_merge_equals_sorting_everything_in_memory(tmp_path: Path, dedupe: bool) -> None:
    paths, tables = _random_parts(tmp_path, random.Random(5), 23)
    out = tmp_path / "merged.parquet"
    # A tiny budget and fan-in: batches of a few rows, and three passes through temp files.
    rows = merge_sorted(paths, out, ["k", "j"], dedupe=dedupe, scratch=tmp_path / "scratch",
                        budget=4096, fan_in=3)
    expected = sort_rows(pa.concat_tables(tables, promote_options="default"), ["k", "j"])
    if dedupe:
        expected = dedupe_sorted(expected, ["k", "j"])
    got = pq.read_table(out)
    assert rows == got.num_rows == expected.num_rows
    # Equal row for row: ties keep the order of the sources, and the first one is kept.
    assert got.select(expected.column_names).equals(expected)
    assert list((tmp_path / "scratch").iterdir()) == []
    assert pq.ParquetFile(out).metadata.row_group(0).sorting_columns == sorting_columns(
        got.schema, ["k", "j"])


def test_compaction_of_many_parts_keeps_the_first_of_equal_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import spasm.dataset.streaming as streaming

    monkeypatch.setattr(streaming, "FAN_IN", 4)  # 30 parts: three passes
    store = RunStore(tmp_path / "run")
    store.create()
    rows: list[dict[str, Any]] = []
    for b in range(30):
        batch = [{"dialogue_id": f"d{(b * 7 + i) % 50:03d}", "turn_index": i % 3, "speaker": "client",
                  "text": f"batch {b}"} for i in range(6)]
        store.write_batch(f"{b:06d}", {"turns": batch})
        rows += batch
    store.compact("turns")
    parts = store.parts("turns")
    assert len(parts) == 1 and parts[0].name.startswith("part-compacted-")
    turns = open_run(store.dir).table("turns")  # verifies the compacted part's marker
    keys = [(r["dialogue_id"], r["turn_index"]) for r in turns.to_pylist()]
    assert keys == sorted(set(keys))
    first: dict[tuple[str, int], str] = {}
    for r in rows:
        first.setdefault((r["dialogue_id"], r["turn_index"]), r["text"])
    assert {(r["dialogue_id"], r["turn_index"]): r["text"] for r in turns.to_pylist()} == first
    assert list(store.tmp.iterdir()) == []


# -- refusals --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three shards of one config, a shard of another config, a shard stopped by its budget
    and an unsharded run."""
    tmp = tmp_path_factory.mktemp("shards")
    with TestServer() as srv:
        cfg = config_file(tmp, srv.base_url)
        out = {f"s{i}": tmp / f"s{i}" for i in range(3)}
        for i in range(3):
            assert generate(cfg, out[f"s{i}"], "--shard", f"{i}/3") == 0
        out["other"] = tmp / "other"
        assert generate(config_file(tmp, srv.base_url, seed=8), out["other"], "--shard", "2/3") == 0
        out["stopped"] = tmp / "stopped"  # two dialogues at a time: some finish before the cap
        one = config_file(tmp, srv.base_url, engine={"max_dialogues_in_flight": 2})
        assert generate(one, out["stopped"], "--shard", "2/3", "--max-tokens", "3500") == 3
        out["whole"] = tmp / "whole"
        assert generate(cfg, out["whole"]) == 0
    return out


def _merge(tmp: Path, *dirs: Path, extra: tuple[str, ...] = ()) -> int:
    return main(["merge", *map(str, dirs), "--out", str(tmp / "merged"), *extra])


def _nothing_written(tmp: Path) -> bool:
    return not (tmp / "merged").exists() and not any(p.name.startswith(".merged") for p in tmp.iterdir())


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("s0", "s1", "other"), "comes from a different config"),
        (("s0", "s1"), "shard 2/3 is missing"),
        (("s0", "s1", "stopped"), "is unfinished (status stopped)"),
        (("s0", "s1", "s2", "whole"), "is not a shard"),
    ],
)
def test_mismatched_shards_are_refused_naming_the_shard(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    names: tuple[str, ...], message: str,
) -> None:
    assert _merge(tmp_path, *(shards[n] for n in names)) == 2
    err = capsys.readouterr().err
    assert message in err
    named = {"comes from a different config": "other", "shard 2/3 is missing": None,
             "is unfinished (status stopped)": "stopped", "is not a shard": "whole"}[message]
    if named:
        assert str(shards[named]) in err
    assert _nothing_written(tmp_path)


def test_shards_that_ran_with_different_plugins_are_refused(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    copies = {}
    for name in ("s0", "s1", "s2"):
        copies[name] = tmp_path / name
        shutil.copytree(shards[name], copies[name])
    manifest = copies["s1"] / "manifest.json"
    record = json.loads(manifest.read_text())
    assert record["plugins"] == []  # the shards ran without any
    record["plugins"] = [{"entry_point": "mine", "value": "my_plugin", "distribution": "my-plugin",
                          "version": "1.0", "replaces": ["projection 'ecp'"]}]
    manifest.write_text(json.dumps(record))
    assert _merge(tmp_path, *copies.values()) == 2
    err = capsys.readouterr().err
    assert f"shards {copies['s0']} and {copies['s1']} ran with different plugins (none vs " \
        "my-plugin 1.0)" in err
    assert _nothing_written(tmp_path)


def test_overlapping_shards_are_refused(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    again = tmp_path / "s0-again"
    shutil.copytree(shards["s0"], again)
    assert _merge(tmp_path, shards["s0"], again, shards["s1"], shards["s2"]) == 2
    err = capsys.readouterr().err
    assert "are both shard 0/3: they overlap" in err and str(again) in err
    assert _nothing_written(tmp_path)


def test_a_damaged_shard_is_refused_naming_its_part(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "s1-broken"
    shutil.copytree(shards["s1"], broken)
    part = next((broken / "turns.parquet").glob("part-*.parquet"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    assert _merge(tmp_path, shards["s0"], broken, shards["s2"]) == 2
    err = capsys.readouterr().err
    assert str(broken) in err and "checksum" in err
    assert _nothing_written(tmp_path)


def test_allow_partial_merges_what_is_there(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _merge(tmp_path, shards["s0"], shards["stopped"], extra=("--allow-partial",)) == 0
    assert "PARTIAL" in capsys.readouterr().out
    merged = open_run(tmp_path / "merged")
    assert merged.manifest["status"] == "partial" and merged.manifest["missing_shards"] == ["1/3"]
    expected = set(open_run(shards["s0"]).dialogues.dialogue_id) | set(
        open_run(shards["stopped"]).dialogues.dialogue_id)
    assert set(merged.dialogues.dialogue_id) == expected
    assert 0 < len(open_run(shards["stopped"]).dialogues) < 4


def test_merge_refuses_an_out_that_holds_something_else(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "merged").mkdir()
    (tmp_path / "merged" / "notes.txt").write_text("mine")
    assert _merge(tmp_path, shards["s0"], shards["s1"], shards["s2"]) == 2
    assert "exists and holds notes.txt" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "merged").iterdir()] == ["notes.txt"]

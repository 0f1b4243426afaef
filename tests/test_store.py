"""Crash safety of the Parquet store: uncommitted parts vanish, compaction de-duplicates."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from spasm.store import RunStore


def _turn(d: str, i: int) -> dict[str, object]:
    return {"dialogue_id": d, "turn_index": i, "speaker": "client", "text": f"t{i}"}


def test_uncommitted_batch_is_removed_on_recover(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.create()
    store.write_batch("000001", {"turns": [_turn("a", 0)], "dialogues": [{"dialogue_id": "a"}]})
    # A crash after the turns part moved in but before the marker: simulate by removing it.
    store.write_batch("000002", {"turns": [_turn("b", 0)], "dialogues": [{"dialogue_id": "b"}]})
    (store.commits / "000002").unlink()
    (store.tmp / "turns-part-000003.parquet").write_bytes(b"half a file")
    assert store.recover() == 3
    assert store.done_dialogue_ids() == {"a"}
    assert list(pd.read_parquet(tmp_path / "turns.parquet").dialogue_id) == ["a"]
    assert not list(store.tmp.iterdir())


def test_compaction_sorts_and_deduplicates(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.create()
    store.write_batch("000001", {"turns": [_turn("b", 1), _turn("b", 0)]})
    store.write_batch("000002", {"turns": [_turn("a", 0), _turn("b", 0)]})
    store.compact_all()
    assert len(store.parts("turns")) == 1
    df = pd.read_parquet(tmp_path / "turns.parquet")
    assert list(zip(df.dialogue_id, df.turn_index, strict=True)) == [("a", 0), ("b", 0), ("b", 1)]


def test_interrupted_compaction_is_finished_on_recover(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.create()
    store.write_batch("000001", {"turns": [_turn("a", 0)]})
    store.write_batch("000002", {"turns": [_turn("b", 0)]})
    old = store.parts("turns")
    store.compact("turns")
    # Pretend the old parts survived a crash right after the compacted file moved in.
    compacted = store.parts("turns")[0]
    for p in old:
        p.write_bytes(compacted.read_bytes())
    import json

    (tmp_path / ".compaction.json").write_text(
        json.dumps({"result": str(compacted), "replaces": [str(p) for p in old]})
    )
    store.recover()
    assert len(pd.read_parquet(tmp_path / "turns.parquet")) == 2

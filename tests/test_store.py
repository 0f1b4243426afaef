"""The run format's owner: typed rows (a misspelled field is an error), crash-safe batches
(uncommitted parts vanish, compaction de-duplicates) and the reader, ``open_run``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spasm.dataset import DialogueRow, RunStore, TurnRow, open_run
from spasm.errors import FormatError


def _turn(d: str, i: int) -> dict[str, object]:
    return {"dialogue_id": d, "turn_index": i, "speaker": "client", "text": f"t{i}"}


def _dialogue(d: str, **extra: Any) -> DialogueRow:
    return DialogueRow(
        dialogue_id=d, persona_id="p0", conversation_index=0, condition="ecp", pairing="a/b",
        client_backend="a", client_model="m", responder_backend="b", responder_model="m",
        seed=1, n_utterances=2, termination_reason="max_turns", **extra,
    )


def test_uncommitted_batch_is_removed_on_recover(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.create()
    store.write_batch("000001", {"turns": [_turn("a", 0)], "dialogues": [_dialogue("a")]})
    # A crash after the turns part moved in but before the marker: simulate by removing it.
    store.write_batch("000002", {"turns": [_turn("b", 0)], "dialogues": [_dialogue("b")]})
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


def test_a_row_with_a_misspelled_field_is_an_error_and_nothing_is_written(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.create()
    bad = {**_turn("a", 0), "atempts": 2}
    with pytest.raises(FormatError, match="atempts: undeclared field"):
        store.write_batch("000001", {"dialogues": [_dialogue("a")], "turns": [bad]})
    with pytest.raises(ValueError, match="atempts"):
        TurnRow.model_validate({**_turn("a", 0), "atempts": 2})
    assert not store.parts("dialogues") and not store.parts("turns")
    assert not list(store.commits.iterdir())


def test_a_row_missing_a_required_field_is_an_error(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with pytest.raises(FormatError, match="persona_id: Field required"):
        store.write_batch("000001", {"dialogues": [{"dialogue_id": "a"}]})


def test_open_run_reads_committed_parts_only_and_dialogues_with_their_turns(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.create()
    store.write_batch("000001", {"dialogues": [_dialogue("a")], "turns": [_turn("a", 1), _turn("a", 0)]})
    store.write_batch("000002", {"dialogues": [_dialogue("b")], "turns": [_turn("b", 0)]})
    (store.commits / "000002").unlink()  # written but not committed: invisible to readers
    run = open_run(tmp_path)
    assert list(run.dialogues.dialogue_id) == ["a"]
    assert sorted(run.turns.dialogue_id) == ["a", "a"]
    view = run.dialogue("a")
    assert [t["turn_index"] for t in view.turns] == [0, 1]
    # No system prompt or digest was stored: the re-projection is unverified, not "ok".
    seen = view.seen(1)
    assert seen.verified is None and seen.messages[-1] == {"role": "assistant", "content": "t0"}
    batches = list(run.batches("turns", columns=["text"], batch_size=1))
    assert sum(b.num_rows for b in batches) == 2 and batches[0].schema.names == ["text"]


def test_open_run_fills_columns_an_older_table_lacks_with_their_defaults(tmp_path: Path) -> None:
    # An import written before schema 1.2: single Parquet files with only the core columns.
    pq.write_table(pa.table({"dialogue_id": ["d"], "persona_id": ["p"]}), tmp_path / "dialogues.parquet")
    pq.write_table(pa.table({"dialogue_id": ["d"], "turn_index": [0], "speaker": ["client"],
                             "text": ["hi"]}), tmp_path / "turns.parquet")
    run = open_run(tmp_path)
    d = run.dialogues.iloc[0]
    assert d.status == "ok" and d.harness_level == "A" and d.harness_fallbacks == 0
    assert pd.isna(d.condition)  # required and unknown: null, never invented
    assert run.turns.attempts.tolist() == [1]


def test_replace_table_swaps_the_whole_table_and_a_crash_mid_swap_is_finished(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from spasm.dataset import QARow

    store = RunStore(tmp_path)
    store.create()
    now = datetime.now(UTC)
    store.write_batch("000001", {"qa": [QARow(dialogue_id="a", kind="email", evidence="x@y.z",
                                              found_at=now)]})
    store.replace_table("qa", [QARow(dialogue_id="b", kind="url", evidence="http://e", found_at=now)])
    assert list(open_run(tmp_path).df("qa").dialogue_id) == ["b"]
    # A crash after the new part moved in but before the old ones were removed: recover ends it.
    (new,) = store.parts("qa")
    stale = new.with_name("part-000009.parquet")
    stale.write_bytes(new.read_bytes())
    (store.commits / "000009").touch()
    (tmp_path / ".compaction.json").write_text(json.dumps({"result": str(new), "replaces": [str(stale)]}))
    store.recover()
    assert store.parts("qa") == [new]


def test_a_damaged_part_is_found_by_readers_and_repaired_by_the_writer(tmp_path: Path) -> None:
    from spasm.errors import UserError

    store = RunStore(tmp_path)
    store.create()
    store.write_batch("000001", {"dialogues": [_dialogue("a")], "turns": [_turn("a", 0)]})
    store.write_batch("000002", {"dialogues": [_dialogue("b")], "turns": [_turn("b", 0)]})
    marker = json.loads((store.commits / "000002").read_text())
    assert marker["parts"]["turns"]["rows"] == 1 and len(marker["parts"]["turns"]["sha256"]) == 64
    part = tmp_path / "turns.parquet" / "part-000002.parquet"
    # Same rows, other bytes: a bit flip the row count cannot see.
    pq.write_table(pa.table({"dialogue_id": ["b"], "turn_index": pa.array([0], pa.int32()),
                             "speaker": ["client"], "text": ["tampered"]}), part)
    with pytest.raises(UserError, match=r"damaged parts: turns.parquet/part-000002.parquet: contents"):
        open_run(tmp_path)
    found = store.repair()
    assert [d.batch for d in found] == ["000002"]
    assert store.done_dialogue_ids() == {"a"}  # b is redone by the next generate
    assert list(open_run(tmp_path).turns.text) == ["t0"]


def test_compaction_keeps_the_run_verifiable(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.create()
    store.write_batch("000001", {"turns": [_turn("a", 0)]})
    store.write_batch("000002", {"turns": [_turn("b", 0)]})
    store.compact_all()
    assert len(open_run(tmp_path).turns) == 2  # verifies: merged batches are not "missing"
    (compacted,) = store.parts("turns")
    compacted.write_bytes(compacted.read_bytes()[:-20])  # truncated on disk
    assert [d.table for d in store.repair()] == ["turns"]
    assert store.parts("turns") == []

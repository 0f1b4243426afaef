"""Silent data-loss paths: dialogue ids that cannot collide and a
summary that counts what was stored; integrity that depends on content, never on file times;
writers of `qa.parquet` that take the run lock."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest

import spasm.runplan
from spasm.cli import main
from spasm.dataset import open_run
from spasm.dataset.integrity import find_damage
from spasm.dataset.lock import lock_holder
from spasm.dataset.store import RunStore
from spasm.engine import Engine
from spasm.errors import ConfigError, RunError, UserError
from spasm.runplan import dialogue_id, legacy_dialogue_id, plan
from spasm.status import run_status
from spasm.testing import TestServer
from tests.conftest import config_from, endpoint_config, make_persona

# ------------------------------------------------------------------ 1. ids unique by construction

#: Backend names whose "-" join collides: gpt/4o-mini and gpt-4o/mini were one id.
FOUR = ("gpt", "gpt-4o", "4o-mini", "mini")
PAIRINGS = [{"client": "gpt", "responder": "4o-mini"}, {"client": "gpt-4o", "responder": "mini"}]


def _four(base_url: str, **overrides: Any) -> dict[str, Any]:
    backends = {name: {"kind": "openai", "base_url": base_url, "model": f"m-{name}"} for name in FOUR}
    return endpoint_config(base_url, backends=backends, pairings=PAIRINGS, **overrides)


def _decode(part: str) -> str:
    return part.replace("%2D", "-").replace("%25", "%")


def _parse(did: str, *, sweep: bool) -> tuple[str, int, str, str, str, str | None]:
    """Read an id from the right: every part after the persona id is free of "-"."""
    if sweep:
        rest, level = did.rsplit("-", 1)
    else:
        rest, level = did, None
    rest, client, responder, condition = rest.rsplit("-", 3)
    persona, k = rest.rsplit("-k", 1)
    return persona, int(k), _decode(client), _decode(responder), _decode(condition), level


def _random_name(rng: random.Random) -> str:
    # Mostly the characters that make trouble: the separator, the escape and what it spells.
    return "".join(rng.choice("-%2Dkd0a_") for _ in range(rng.randint(1, 6)))


@pytest.mark.e2e
def test_dialogue_ids_are_injective_over_random_names_and_parse_back() -> None:
    rng = random.Random(22)
    seen: dict[str, tuple[Any, ...]] = {}
    for _ in range(60_000):
        sweep = rng.random() < 0.5
        parts = (
            rng.choice(["p0000-1a2b3c4d", "p0001-k0", "a-k1-b", "-", "p%2D"]) + _random_name(rng)[:2],
            rng.randint(0, 12),
            _random_name(rng), _random_name(rng), _random_name(rng),
            rng.choice("ABCDE") if sweep else None,
        )
        did = dialogue_id(*parts)
        assert seen.setdefault(did, parts) == parts, (did, parts, seen[did])
        assert _parse(did, sweep=sweep) == parts


def test_every_pairing_of_short_troublesome_names_has_its_own_id() -> None:
    names = ["".join(t) for n in (1, 2, 3) for t in itertools.product("a-%2D", repeat=n)]
    ids = {dialogue_id("p0000-abcd", 0, c, r, "ecp") for c in names for r in names}
    assert len(ids) == len(names) ** 2


def test_ids_of_plain_names_are_byte_identical_to_earlier_versions() -> None:
    rng = random.Random(7)
    for _ in range(5_000):
        name = "".join(rng.choice("abcXYZ019_.:@ ") for _ in range(rng.randint(1, 12)))
        args = ("p0003-deadbeef", rng.randint(0, 9), name, name[::-1] or "x", "concat")
        assert dialogue_id(*args) == legacy_dialogue_id(*args)
        assert dialogue_id(*args, "E") == legacy_dialogue_id(*args, "E")
    assert dialogue_id("p0000-1a2b3c4d", 0, "srv", "srv", "ecp", "A") == "p0000-1a2b3c4d-k0-srv-srv-ecp-A"
    assert dialogue_id("p0000-1a2b3c4d", 0, "gpt", "4o-mini", "ecp") == "p0000-1a2b3c4d-k0-gpt-4o%2Dmini-ecp"


def test_the_four_colliding_backends_plan_four_ids() -> None:
    config = config_from(_four("http://127.0.0.1:9/v1", personas={"n": 2}))
    personas = [make_persona(f"p{i:04d}-00000000", i) for i in range(2)]
    ids = [s.dialogue_id for s in plan(config, personas)]
    assert len(ids) == len(set(ids)) == 4
    # The bug this replaces: the old ids of the two pairings were one.
    old = {s.dialogue_id for s in plan(config, personas, ids=legacy_dialogue_id)}
    assert len(old) == 2


def test_a_pairing_listed_twice_is_a_config_error_naming_it() -> None:
    data = _four("http://127.0.0.1:9/v1")
    data["pairings"] = [*PAIRINGS, PAIRINGS[0]]
    with pytest.raises(ConfigError, match=r"pairings: .*pairing gpt/4o-mini is listed twice"):
        config_from(data)


@pytest.mark.parametrize("name", ["a/b", "", "x\ny", "back\\slash", "a..b"])
def test_a_backend_name_that_would_make_labels_ambiguous_is_a_config_error(name: str) -> None:
    data = endpoint_config("http://127.0.0.1:9/v1")
    data["backends"] = {name: data["backends"]["srv"]}
    data["pairings"] = [{"client": name, "responder": name}]
    with pytest.raises(ConfigError, match="is not allowed"):
        config_from(data)


def test_planned_ids_that_collide_stop_the_run_before_any_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spasm.runplan, "id_part", lambda name: name)  # the old, ambiguous join
    with TestServer() as srv:
        config = config_from(_four(srv.base_url, personas={"n": 2}))
        with pytest.raises(RunError, match="two planned dialogues share the id"):
            anyio.run(Engine(config, tmp_path / "run", progress=False, sleep_scale=0.0).run)
        assert srv.requests == []  # not even the preflight
    assert not (tmp_path / "run").exists()


def test_a_repeated_persona_id_stops_the_plan() -> None:
    config = config_from(endpoint_config("http://127.0.0.1:9/v1"))
    with pytest.raises(RunError, match="repeats a persona id"):
        list(plan(config, [make_persona("p1"), make_persona("p1", 1)]))


def test_the_four_backends_store_four_dialogues_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with TestServer() as srv:
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(_four(srv.base_url, personas={"n": 2})))
        run = tmp_path / "run"
        assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 0
    assert "4/4 dialogues" in capsys.readouterr().out
    stored = pd.read_parquet(run / "dialogues.parquet")
    assert len(stored) == stored.dialogue_id.nunique() == 4
    assert sorted(stored.pairing.unique()) == ["gpt-4o/mini", "gpt/4o-mini"]
    assert stored.groupby("pairing").size().tolist() == [2, 2]


def test_the_summary_counts_what_was_stored_not_what_ran(tmp_path: Path) -> None:
    """A dialogue that ran but did not land (here: its row carries another dialogue's id) is
    not counted: the summary reads the dialogues table back."""
    first: list[str] = []

    with TestServer() as srv:
        config = config_from(endpoint_config(srv.base_url, personas={"n": 3}))
        engine = Engine(config, tmp_path / "run", progress=False, sleep_scale=0.0)
        real = engine._simulate

        async def simulate(spec: Any, *args: Any) -> Any:
            result = await real(spec, *args)
            if not first:
                first.append(spec.dialogue_id)
            if result.dialogue is not None:
                result.dialogue = result.dialogue.model_copy(update={"dialogue_id": first[0]})
            return result

        engine._simulate = simulate
        summary = anyio.run(engine.run)
    assert summary.new == 3 and summary.planned == 3
    assert summary.completed == 1, summary.line()
    assert summary.line().startswith("1/3 dialogues; 3 new")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "incomplete" and manifest["counts"]["completed"] == 1


def test_a_run_with_old_unescaped_ids_is_refused_not_regenerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with TestServer() as srv:
        data = _four(srv.base_url, personas={"n": 2})
        data["pairings"] = [PAIRINGS[1]]  # gpt-4o/mini: old ids without a collision
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(data))
        run = tmp_path / "run"
        args = ["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]
        with monkeypatch.context() as m:
            m.setattr(spasm.runplan, "id_part", lambda name: name)  # as an older spasm wrote it
            assert main(args) == 0
        before = len(srv.requests)
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "written by an older spasm" in err and "--overwrite" in err
        assert len(srv.requests) <= before + 2  # at most the preflights: nothing regenerated
        assert main([*args, "--overwrite"]) == 0
    ids = pd.read_parquet(run / "dialogues.parquet").dialogue_id
    assert len(ids) == 2 and all("gpt%2D4o" in d for d in ids)


# ------------------------------------------------------------------ 2. integrity by content only

@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A finished run of several batches (flush_every 1), compacted, with a qa table."""
    run = tmp_path_factory.mktemp("integrity") / "run"
    with TestServer() as srv:
        config = config_from(endpoint_config(srv.base_url, personas={"n": 3},
                                             engine={"flush_every": 1}))
        summary = anyio.run(Engine(config, run, progress=False, sleep_scale=0.0).run)
    assert summary.completed == summary.planned == 3
    assert main(["qa", str(run)]) == 0  # a replace_table: one more compacted part
    yield run


def _copy_without_mtimes(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, copy_function=shutil.copy)  # contents and modes, no times
    future = time.time() + 3600
    for marker in (dst / ".commits").iterdir():  # every commit marker newer than every part
        os.utime(marker, (future, future))
    return dst


def test_a_copy_that_keeps_no_mtimes_reads_healthy(small_run: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    copy = _copy_without_mtimes(small_run, tmp_path / "copy")
    batches = [m for m in (copy / ".commits").iterdir() if not m.name.startswith("compacted")]
    assert len(batches) >= 3  # batch parts merged away by compaction: only their markers remain
    assert find_damage(copy) == []
    assert len(open_run(copy).dialogues) == 3
    assert run_status(copy).damaged == []
    capsys.readouterr()
    assert main(["status", str(copy)]) == 0
    assert "DAMAGED" not in capsys.readouterr().out
    assert main(["qa", str(copy)]) == 0  # a writer takes it as healthy too


def test_real_damage_in_a_copy_is_still_found(small_run: Path, tmp_path: Path) -> None:
    copy = _copy_without_mtimes(small_run, tmp_path / "copy")
    (part,) = (copy / "turns.parquet").glob("part-compacted-*.parquet")
    part.unlink()
    assert [d.table for d in find_damage(copy)] == ["turns"]
    with pytest.raises(UserError, match=r"damaged parts: turns\.parquet/part-compacted-"):
        open_run(copy)

    copy2 = _copy_without_mtimes(small_run, tmp_path / "copy2")
    # A batch committed after the compaction (like the eval's call log), then lost.
    store = RunStore(copy2)
    calls = open_run(copy2).table("calls").slice(0, 2).to_pylist()
    store.write_batch("999999-eval", {"calls": calls})
    assert find_damage(copy2) == []
    (copy2 / "calls.parquet" / "part-999999-eval.parquet").unlink()
    found = find_damage(copy2)
    assert [(d.batch, d.table, d.problem) for d in found] == [("999999-eval", "calls", "missing")]


def test_compacted_markers_say_what_they_supersede(small_run: Path) -> None:
    markers = {m.name: json.loads(m.read_text()) for m in (small_run / ".commits").iterdir()}
    compacted = {n: d for n, d in markers.items() if n.startswith("compacted")}
    (dialogues,) = [d for d in compacted.values() if "dialogues" in d["parts"]]
    batches = {n for n, d in markers.items() if "dialogues" in (d.get("parts") or {})
               and not n.startswith("compacted")}
    assert batches and set(dialogues["supersedes"]) == batches


def test_a_run_compacted_by_an_older_version_still_reads_healthy(small_run: Path, tmp_path: Path) -> None:
    copy = _copy_without_mtimes(small_run, tmp_path / "old")
    for marker in (copy / ".commits").glob("compacted-*"):  # markers before "supersedes"
        data = json.loads(marker.read_text())
        data.pop("supersedes")
        marker.write_text(json.dumps(data))
    assert find_damage(copy) == []
    # A new compaction over such a part still records what the older one had merged.
    store = RunStore(copy)
    old_batches = {m.name for m in (copy / ".commits").iterdir() if not m.name.startswith("compacted")
                   and "calls" in json.loads(m.read_text() or "{}").get("parts", {})}
    calls = open_run(copy).table("calls").slice(0, 1).to_pylist()
    calls[0]["call_id"] += "-eval"
    store.write_batch("999999-eval", {"calls": calls})
    store.compact("calls")
    (marker,) = [json.loads(m.read_text()) for m in (copy / ".commits").glob("compacted-*")
                 if "calls" in json.loads(m.read_text())["parts"]]
    assert old_batches | {"999999-eval"} <= set(marker["supersedes"])
    assert find_damage(copy) == []
    assert len(open_run(copy).table("calls")) == len(pd.read_parquet(small_run / "calls.parquet")) + 1


# ------------------------------------------------------------------ 6. qa writers take the lock

def _hold_lock(run: Path) -> subprocess.Popen[str]:
    code = (f"from spasm.dataset.lock import RunLock; RunLock({str(run)!r}).acquire(); "
            "print('ok', flush=True); input()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
    assert lock_holder(run) == holder.pid
    return holder


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_qa_and_export_refuse_a_run_another_process_writes_and_write_nothing(
    small_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    before = _snapshot(run)
    holder = _hold_lock(run)
    try:
        capsys.readouterr()
        assert main(["qa", str(run)]) == 2
        err = capsys.readouterr().err
        assert f"is being written by process {holder.pid}" in err and "Traceback" not in err
        out = tmp_path / "export"
        assert main(["export", str(run), "--out", str(out), "--allow-unfinished"]) == 2
        assert f"is being written by process {holder.pid}" in capsys.readouterr().err
        assert not out.exists()
        assert not list(tmp_path.glob(".export.*"))  # no staging directory left either
        assert main(["harness-report", str(run)]) == 2  # it writes harness_report.* into the run
        assert f"is being written by process {holder.pid}" in capsys.readouterr().err
        assert _snapshot(run) == before
    finally:
        holder.kill()
        holder.wait()
    assert main(["qa", str(run)]) == 0  # the lock released, the same command works


def test_a_crash_before_the_compacted_marker_is_finished_by_recover(
    small_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import spasm.dataset.store as store_module

    copy = tmp_path / "run"
    shutil.copytree(small_run, copy)
    store = RunStore(copy)
    calls = open_run(copy).table("calls").slice(0, 1).to_pylist()
    calls[0]["call_id"] += "-eval"
    store.write_batch("999999-eval", {"calls": calls})
    real = store_module.atomic_write_json

    def crash(path: Path, data: Any) -> None:
        if Path(path).parent.name == ".commits" and Path(path).name.startswith("compacted"):
            raise KeyboardInterrupt  # killed between moving the part in and its commit
        real(path, data)

    with monkeypatch.context() as m:
        m.setattr(store_module, "atomic_write_json", crash)
        with pytest.raises(KeyboardInterrupt):
            store.compact("calls")
    store.recover()
    assert find_damage(copy) == []
    assert len(store.parts("calls")) == 1
    assert len(open_run(copy).table("calls")) == len(open_run(small_run).table("calls")) + 1


@pytest.mark.e2e
def test_eval_into_a_run_that_another_process_writes_is_refused(tmp_path: Path) -> None:
    """spasm eval writes eval/ into the run (and its LLM calls into the call log): it takes the
    run lock, so a run another writer holds is refused naming it (exit 2); with --out elsewhere
    and no LLM it only reads the run and needs no lock."""
    from spasm.dataset.lock import RunLock
    from spasm.dataset.synthetic import synthesize_run
    from spasm.errors import UserError
    from spasm.evaluation import evaluate

    run = Path(synthesize_run(tmp_path / "run", n_dialogues=6, n_personas=3))
    with RunLock(run):
        with pytest.raises(UserError, match="is being written by process"):
            evaluate(run, progress=False)
        assert main(["eval", str(run), "--no-progress"]) == 2
        assert not (run / "eval" / "metrics.json").exists()
        evaluate(run, progress=False, out_dir=tmp_path / "elsewhere")
        assert (tmp_path / "elsewhere" / "metrics.json").is_file()
    evaluate(run, progress=False)
    assert (run / "eval" / "metrics.json").is_file()

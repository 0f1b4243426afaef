"""The run engine under faults, budget caps, dry runs and determinism."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pyarrow.parquet as pq

from spasm.cli import main
from spasm.config import parse_config
from spasm.engine import Engine
from spasm.testing import FaultPlan, TestServer
from tests.conftest import endpoint_config


def _config(base_url: str, **overrides: Any) -> Any:
    data = endpoint_config(base_url, **overrides)
    return parse_config(data, "<test>")


def _run(config: Any, run: Path, **kwargs: Any) -> Any:
    engine = Engine(config, run, progress=False, sleep_scale=0.02, **kwargs)
    return anyio.run(engine.run)


def test_faults_are_retried_and_nothing_is_lost(tmp_path: Path) -> None:
    plan = FaultPlan(rate_429=0.2, retry_after_s=0.01, rate_500=0.05, rate_hang=0.02, hang_s=1.0,
                     rate_malformed=0.05, rate_drop=0.02, rate_empty=0.02, seed=3)
    with TestServer(plan) as srv:
        config = _config(
            srv.base_url,
            personas={"n": 6},
            conditions=["ecp", "concat"],
            backends={"srv": {"kind": "openai", "base_url": srv.base_url, "model": "m",
                              "timeout_s": 0.3, "max_attempts": 12, "max_concurrency": 8}},
            engine={"flush_every": 3},
        )
        summary = _run(config, tmp_path / "run")
    assert summary.errors == 0
    assert summary.completed == summary.planned == 12
    dialogues = pd.read_parquet(tmp_path / "run" / "dialogues.parquet")
    assert dialogues.dialogue_id.is_unique and len(dialogues) == 12
    turns = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    assert not turns.duplicated(["dialogue_id", "turn_index"]).any()
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    seen = set(calls.outcome)
    assert {"ok", "rate_limited", "server_error", "timeout", "malformed"} <= seen, seen
    assert calls.call_id.is_unique
    # Every turn's call succeeded eventually; failed attempts are logged with their error.
    assert calls[calls.outcome != "ok"].error.notna().all()


def test_a_dialogue_that_keeps_failing_is_quarantined(tmp_path: Path) -> None:
    def reply(body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        doomed = "You are talking with" in system and hashlib.md5(system.encode()).digest()[0] % 2
        return "" if doomed else "Fine, thanks."

    with TestServer(reply=reply) as srv:
        config = _config(srv.base_url, personas={"n": 8},
                         backends={"srv": {"kind": "openai", "base_url": srv.base_url,
                                           "model": "m", "max_attempts": 2}})
        summary = _run(config, tmp_path / "run")
    errors = pd.read_parquet(tmp_path / "run" / "errors.parquet")
    dialogues = pd.read_parquet(tmp_path / "run" / "dialogues.parquet")
    assert summary.errors == len(errors) > 0
    assert len(dialogues) + len(errors) == 8
    assert set(errors.error_type) == {"EmptyCompletionError"}
    assert "EmptyCompletionError" in summary.line()


def test_token_cap_stops_cleanly_and_resume_finishes(tmp_path: Path, capsys: Any) -> None:
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 6}, engine={"flush_every": 1},
                               backends={"srv": {"kind": "openai", "base_url": srv.base_url,
                                                 "model": "m", "max_concurrency": 1}})
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(data))
        run = tmp_path / "run"
        args = ["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]
        assert main([*args, "--max-tokens", "3000"]) == 3
        err = capsys.readouterr().err
        assert "token cap reached" in err and "rerun" in err
        partial = pd.read_parquet(run / "dialogues.parquet")
        assert 0 < len(partial) < 6
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["status"] == "stopped"
        assert main(args) == 0
        full = pd.read_parquet(run / "dialogues.parquet")
    assert len(full) == 6 and full.dialogue_id.is_unique
    kept = full.set_index("dialogue_id").loc[partial.dialogue_id].reset_index()
    pd.testing.assert_frame_equal(kept, partial.reset_index(drop=True), check_like=True)


def test_dry_run_estimate_within_25_percent(tmp_path: Path, capsys: Any) -> None:
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 8}, conditions=["ecp", "concat"],
                               dialogue={"max_turns_per_agent": 5, "max_tokens": 60})
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(data))
        run = tmp_path / "run"
        base = ["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]
        assert main([*base, "--dry-run"]) == 0
        assert not run.exists()  # an uncalibrated dry run writes nothing
        capsys.readouterr()
        assert main([*base, "--dry-run", "--pilot", "2"]) == 0
        out = capsys.readouterr().out
        total_line = next(line for line in out.splitlines() if line.startswith("TOTAL"))
        fields = total_line.split()
        estimated = float(fields[3].replace(",", "")) + float(fields[4].replace(",", ""))
        assert main(base) == 0
    actual = pd.read_parquet(run / "calls.parquet")
    actual = actual[actual.outcome == "ok"]
    reported = int(actual.prompt_tokens.sum() + actual.completion_tokens.sum())
    assert abs(estimated - reported) / reported <= 0.25, (estimated, reported)


def test_same_seed_same_tables(tmp_path: Path) -> None:
    with TestServer() as srv:
        config = _config(srv.base_url, conditions=["ecp", "concat"], engine={"cache": False})
        _run(config, tmp_path / "a")
        _run(config, tmp_path / "b")
    for table in ("personas", "dialogues"):
        a = pq.read_table(tmp_path / "a" / f"{table}.parquet")
        b = pq.read_table(tmp_path / "b" / f"{table}.parquet")
        assert a.equals(b), table
    ta = pd.read_parquet(tmp_path / "a" / "turns.parquet").drop(columns=["latency_s"])
    tb = pd.read_parquet(tmp_path / "b" / "turns.parquet").drop(columns=["latency_s"])
    pd.testing.assert_frame_equal(ta, tb)


def test_cache_replays_instead_of_calling(tmp_path: Path) -> None:
    with TestServer() as srv:
        config = _config(srv.base_url)
        first = _run(config, tmp_path / "run")
        chats = sum("messages" in b for b in srv.requests)
        # Lose the tables but keep the cache: the rerun must not call the server again.
        for d in (tmp_path / "run").glob("*.parquet"):
            import shutil

            shutil.rmtree(d)
        for marker in (tmp_path / "run" / ".commits").iterdir():
            marker.unlink()
        second = _run(config, tmp_path / "run")
        assert sum("messages" in b for b in srv.requests) == chats
    assert second.completed == first.completed
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    assert calls.cache_hit.all()


def test_a_budget_stop_with_one_dialogue_in_flight_stops_cleanly(tmp_path: Path, capsys: Any) -> None:
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 4},
                               engine={"flush_every": 1, "max_dialogues_in_flight": 1})
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(data))
        args = ["generate", "--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]
        assert main([*args, "--max-tokens", "3000"]) == 3
    err = capsys.readouterr().err
    assert "token cap reached" in err and "Traceback" not in err


def test_slow_dialogues_are_committed_as_they_finish_not_when_the_batch_fills(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import anyio

    import spasm.engine
    from spasm.engine import Engine
    from tests.conftest import config_from

    monkeypatch.setattr(spasm.engine, "FLUSH_AFTER_S", 0.0)  # every dialogue counts as slow
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 4},
                               engine={"flush_every": 100, "max_dialogues_in_flight": 1})
        anyio.run(Engine(config_from(data), tmp_path / "run", progress=False).run)
    markers = [json.loads(p.read_text()) for p in (tmp_path / "run" / ".commits").iterdir()
               if not p.name.startswith("compacted")]  # the end-of-run compaction's own marker
    batches = [m for m in markers if "dialogues" in m.get("parts", {})]
    assert len(batches) == 4  # one commit per finished dialogue, although the batch holds 100

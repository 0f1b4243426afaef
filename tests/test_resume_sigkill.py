"""kill -9 at several points, rerun the same command: nothing lost, nothing duplicated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from spasm.dataset import open_run
from spasm.errors import UserError
from spasm.testing import FaultPlan, TestServer
from tests.conftest import endpoint_config

pytestmark = pytest.mark.e2e


def _command(cfg: Path, run: Path) -> list[str]:
    return [sys.executable, "-m", "spasm", "generate", "--config", str(cfg), "--out", str(run),
            "--no-progress"]


def _committed_dialogues(run: Path) -> pd.DataFrame:
    """What a reader sees while the run may still be writing (committed parts only)."""
    for _ in range(50):
        try:
            run_data = open_run(run, verify=False)
            if not run_data.has("dialogues"):
                return pd.DataFrame()
            return run_data.df("dialogues")
        except (FileNotFoundError, UserError):
            time.sleep(0.01)  # a concurrent compaction replaced the parts: read again
    raise AssertionError("the dialogues table could not be read")


def _wait_for(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end and not predicate():
        time.sleep(0.01)


def test_sigkill_and_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    with TestServer(FaultPlan(latency_s=0.03)) as srv:
        data = endpoint_config(
            srv.base_url, personas={"n": 8}, conditions=["ecp", "concat"],
            backends={"srv": {"kind": "openai", "base_url": srv.base_url, "model": "m",
                              "max_concurrency": 3}},
            engine={"flush_every": 2},
        )
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(data))
        reference = tmp_path / "reference"
        subprocess.run(_command(cfg, reference), check=True, capture_output=True)

        run = tmp_path / "run"
        kept: list[pd.DataFrame] = []
        kill_points = [
            lambda: (run / "config.json").exists(),  # during start-up
            lambda: len(_committed_dialogues(run)) >= 2,  # after the first batches
            lambda: len(_committed_dialogues(run)) >= 8,  # half-way
            lambda: len(_committed_dialogues(run)) >= 14,  # near the end
        ]
        for point in kill_points:
            proc = subprocess.Popen(_command(cfg, run), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            _wait_for(lambda p=proc, f=point: f() or p.poll() is not None, timeout=60)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            # Whatever the moment, the tables on disk read cleanly.
            for table in ("dialogues", "turns", "calls"):
                if (run / f"{table}.parquet").exists():
                    pd.read_parquet(run / f"{table}.parquet")
            kept.append(_committed_dialogues(run))
        final = subprocess.run(_command(cfg, run), capture_output=True, text=True)
        assert final.returncode == 0, final.stderr

    ref_d = pd.read_parquet(reference / "dialogues.parquet").set_index("dialogue_id")
    got_d = pd.read_parquet(run / "dialogues.parquet").set_index("dialogue_id")
    assert got_d.index.is_unique and sorted(got_d.index) == sorted(ref_d.index)
    assert len(got_d) == 16
    ref_t = pd.read_parquet(reference / "turns.parquet").drop(columns=["latency_s"])
    got_t = pd.read_parquet(run / "turns.parquet")
    assert not got_t.duplicated(["dialogue_id", "turn_index"]).any()
    pd.testing.assert_frame_equal(got_t.drop(columns=["latency_s"]), ref_t)
    # Rows committed before each kill survive exactly, byte for byte, seen through the same
    # reader (which shows every column of the format, null where this run has none).
    seen_d = _committed_dialogues(run).set_index("dialogue_id")
    assert sorted(seen_d.index) == sorted(got_d.index)
    for before in kept:
        if before.empty:
            continue
        after = seen_d.loc[before.dialogue_id].reset_index()
        pd.testing.assert_frame_equal(after, before, check_like=True)
    assert any(not k.empty for k in kept)


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tmp_path: Path) -> None:
    with TestServer(FaultPlan(latency_s=0.05)) as srv:
        data = endpoint_config(
            srv.base_url, personas={"n": 8},
            backends={"srv": {"kind": "openai", "base_url": srv.base_url, "model": "m",
                              "max_concurrency": 2}},
            # Two dialogues of 8 calls in flight: after 20 requests at least one has finished.
            engine={"flush_every": 100, "max_dialogues_in_flight": 2},
        )
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(data))
        run = tmp_path / "run"
        proc = subprocess.Popen(_command(cfg, run), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        _wait_for(lambda: sum("messages" in b for b in srv.requests) >= 20, timeout=60)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "Run the same command again to resume" in err
        assert "Traceback" not in err
        # Dialogues finished before Ctrl-C were flushed even though the batch was not full.
        done = _committed_dialogues(run)
        assert len(done) >= 1
        resumed = subprocess.run(_command(cfg, run), capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stderr
    assert len(pd.read_parquet(run / "dialogues.parquet")) == 8

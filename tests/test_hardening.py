"""Hostile conditions (issue 12): two writers on one run, replacing a good run with a bad one.

Through the real CLI in subprocesses where processes matter, against the loopback test server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from spasm.cli import main
from spasm.dataset.lock import RunLock, lock_holder
from spasm.testing import FaultPlan, TestServer
from tests.conftest import endpoint_config


def _config(tmp_path: Path, base_url: str, **overrides: Any) -> Path:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(endpoint_config(base_url, **overrides)))
    return cfg


def _generate(cfg: Path, run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spasm", "generate", "--config", str(cfg), "--out", str(run),
            "--no-progress", *extra]


def test_a_second_writer_exits_2_at_once_naming_the_pid_and_the_dataset_is_a_single_runs(
    tmp_path: Path,
) -> None:
    # Slow replies keep the first writer busy for seconds while the second one starts.
    with TestServer(FaultPlan(latency_s=0.5)) as srv:
        cfg = _config(tmp_path, srv.base_url, personas={"n": 6})
        run = tmp_path / "run"
        first = subprocess.Popen(_generate(cfg, run), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while lock_holder(run) is None and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lock_holder(run) == first.pid
        second = subprocess.run(_generate(cfg, run), capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        assert f"is being written by process {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.wait(timeout=120) == 0, first.stderr.read() if first.stderr else ""
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    turns = pd.read_parquet(run / "turns.parquet")
    assert len(dialogues) == 6 and dialogues.dialogue_id.is_unique
    assert not turns.duplicated(["dialogue_id", "turn_index"]).any()
    assert lock_holder(run) is None  # released when the writer exits


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path: Path) -> None:
    code = (f"from spasm.dataset.lock import RunLock; RunLock({str(tmp_path)!r}).acquire(); "
            "print('ok', flush=True); input()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
    assert lock_holder(tmp_path) == holder.pid
    holder.kill()
    holder.wait()
    with RunLock(tmp_path):  # no stale lock after kill -9
        assert lock_holder(tmp_path) is not None


def test_overwrite_keeps_the_good_run_when_the_new_one_completes_nothing(
    tmp_path: Path, capsys: Any
) -> None:
    run = tmp_path / "run"
    with TestServer() as srv:
        good = _config(tmp_path, srv.base_url, personas={"n": 2})
        assert main(["generate", "--config", str(good), "--out", str(run), "--no-progress"]) == 0
        before = pd.read_parquet(run / "turns.parquet")
        srv.set_plan(FaultPlan(rate_500=1.0))  # every call fails from now on
        other = tmp_path / "other.json"
        data = endpoint_config(srv.base_url, personas={"n": 3})
        data["backends"]["srv"]["max_attempts"] = 1
        other.write_text(json.dumps(data))
        code = main(["generate", "--config", str(other), "--out", str(run), "--overwrite",
                     "--no-progress"])
    assert code != 0
    pd.testing.assert_frame_equal(pd.read_parquet(run / "turns.parquet"), before)
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
    assert not list(tmp_path.glob(".run.replaced-*"))


def test_a_damaged_config_json_or_a_changed_config_is_a_clear_refusal(
    tmp_path: Path, capsys: Any
) -> None:
    run = tmp_path / "run"
    with TestServer() as srv:
        cfg = _config(tmp_path, srv.base_url, personas={"n": 1})
        assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 0
        capsys.readouterr()
        assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress",
                     "--personas", "2"]) == 2
        err = capsys.readouterr().err
        assert "personas.n: 1 → 2" in err and "Traceback" not in err
        (run / "config.json").write_bytes(b"\x00\xff not json")
        assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 2
        assert "config.json is damaged" in capsys.readouterr().err

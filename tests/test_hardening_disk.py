"""A full disk is the environment, never a bug: the run stops with the CLI's
disk-full message naming the file, no traceback, nothing quarantined, and the same command
resumes once there is space.

SQLite's own "database or disk is full" (SQLITE_FULL) is raised for real by capping the
cache's size with ``PRAGMA max_page_count``; where this process may mount a tmpfs (root in a
container), a run on a really full file system is checked too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import spasm.calls
from spasm.cli import main
from spasm.testing import TestServer
from tests.conftest import endpoint_config


def _config(tmp_path: Path, base_url: str) -> Path:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(endpoint_config(base_url, personas={"n": 6},
                                              engine={"flush_every": 2})))
    return cfg


def _errors(run: Path) -> int:
    return len(pd.read_parquet(run / "errors.parquet")) if (run / "errors.parquet").exists() else 0


def test_a_full_cache_stops_the_run_with_the_disk_full_message_and_quarantines_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_init = spasm.calls.Cache.__init__

    def capped(self: Any, path: Path) -> None:
        real_init(self, path)
        pages = self._db.execute("PRAGMA page_count").fetchone()[0]
        self._db.execute(f"PRAGMA max_page_count = {pages + 2}")  # SQLite's own SQLITE_FULL

    run = tmp_path / "run"
    with TestServer() as srv:
        cfg = _config(tmp_path, srv.base_url)
        args = ["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]
        monkeypatch.setattr(spasm.calls.Cache, "__init__", capped)
        assert main(args) == 1
        err = capsys.readouterr().err
        assert f"run failed: no space left on the device writing {run / 'cache.sqlite'}. Free " \
            "some space and rerun the same command" in err, err
        assert "Traceback" not in err and "bug" not in err and "quarantined" not in err
        assert _errors(run) == 0  # no dialogue was at fault
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["status"] == "failed" and "no space left" in manifest["failed"]
        monkeypatch.setattr(spasm.calls.Cache, "__init__", real_init)
        assert main(args) == 0, capsys.readouterr().err  # space again: the same command resumes
    assert len(pd.read_parquet(run / "dialogues.parquet")) == 6 and _errors(run) == 0
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, where this process may mount one (skipped elsewhere)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.e2e
@pytest.mark.parametrize("free", [60_000, 200_000])
def test_a_really_full_file_system_is_the_disk_full_message_and_a_resume(
        small_disk: Path, tmp_path: Path, free: int) -> None:
    """60 kB free: the cache cannot even be created (once called "damaged, delete it"); 200 kB:
    it fills while dialogues run (once a traceback and every dialogue quarantined)."""
    filler = small_disk / "filler"
    st = os.statvfs(small_disk)
    filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - free))
    run = small_disk / "run"
    with TestServer() as srv:
        cfg = _config(tmp_path, srv.base_url)
        argv = [sys.executable, "-m", "spasm", "generate", "--config", str(cfg), "--out",
                str(run), "--no-progress"]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 1, done.stderr
        assert "run failed: no space left on the device writing" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "damaged" not in done.stderr
        assert "bug" not in done.stderr and _errors(run) == 0
        filler.unlink()
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
    assert len(pd.read_parquet(run / "dialogues.parquet")) == 6 and _errors(run) == 0

"""Hostile conditions: two writers, replaced runs, broken endpoints, signals, damaged
files, absurd input.

Through the real CLI in subprocesses where processes matter, against the loopback test server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spasm.backends.openai_compat import PREFLIGHT_PROMPT
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


@pytest.mark.e2e
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


# --------------------------------------------------------------------------- endpoints


class _Canned(BaseHTTPRequestHandler):
    """A server that is not an OpenAI endpoint: an HTML page, or 404 after the preflight."""

    mode = "html"

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.mode == "html":
            data, status, kind = b"<html><body>Welcome to nginx!</body></html>", 200, "text/html"
        elif PREFLIGHT_PROMPT.encode() in body:
            data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": "ok"}}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
            status, kind = 200, "application/json"
        else:
            data = b'{"error": {"message": "The model `m` does not exist", "type": "invalid_request_error"}}'
            status, kind = 404, "application/json"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _reply

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _canned(mode: str) -> Iterator[str]:
    handler = type("Handler", (_Canned,), {"mode": mode})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _quick(base_url: str, tmp_path: Path, *extra: str) -> list[str]:
    return ["generate", "--base-url", base_url, "--model", "m", "--out", str(tmp_path / "run"),
            "--personas", "2", "--no-progress", *extra]


def test_a_wrong_base_path_is_refused_at_preflight_quoting_the_server(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    wrong = server.base_url.replace("/v1", "/api/v2")
    assert main(_quick(wrong, tmp_path)) == 2
    err = capsys.readouterr().err
    assert "refused a test chat call: 404" in err and "Check base_url" in err
    assert not (tmp_path / "run").exists()


def test_an_endpoint_that_answers_html_is_refused_at_preflight(tmp_path: Path, capsys: Any) -> None:
    with _canned("html") as url:
        assert main(_quick(url, tmp_path)) == 2
    err = capsys.readouterr().err
    assert "does not answer like an OpenAI-compatible server" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_an_endpoint_refusing_every_call_stops_the_run_early_with_its_message(
    tmp_path: Path, capsys: Any
) -> None:
    with _canned("404-after-preflight") as url:
        code = main(_quick(url, tmp_path, "--personas", "8"))
    err = capsys.readouterr().err
    assert code == 1
    assert "refused the first 3 calls with 404: 404 from endpoint: The model `m` does not exist" in err
    # Stopped early: not every planned dialogue was tried and quarantined.
    errors = pd.read_parquet(tmp_path / "run" / "errors.parquet")
    assert len(errors) < 8


@pytest.mark.e2e
def test_a_hung_endpoint_with_short_timeout_and_attempts_stops_with_a_message(
    tmp_path: Path
) -> None:
    with TestServer(FaultPlan(rate_hang=1.0, hang_s=30)) as srv:
        done = subprocess.run(
            [sys.executable, "-m", "spasm", *_quick(srv.base_url, tmp_path, "--timeout", "1",
                                                    "--max-attempts", "2", "--personas", "1")],
            capture_output=True, text=True, timeout=120,
        )
    assert done.returncode == 1, done.stderr
    assert "TimeoutBackendError" in done.stdout and "are being retried (timeout" in done.stderr
    assert "rerun the same command to retry them" in done.stderr


# --------------------------------------------------------------------------- signals, files


@pytest.mark.e2e
def test_sigterm_flushes_finished_dialogues_and_the_rerun_matches_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    with TestServer(FaultPlan(latency_s=0.05)) as srv:
        cfg = _config(tmp_path, srv.base_url, personas={"n": 8},
                      backends={"srv": {"kind": "openai", "base_url": srv.base_url, "model": "m",
                                        "max_concurrency": 2}},
                      engine={"flush_every": 100, "max_dialogues_in_flight": 2})
        reference = tmp_path / "reference"
        subprocess.run(_generate(cfg, reference), check=True, capture_output=True)
        before = len(srv.requests)
        run = tmp_path / "run"
        proc = subprocess.Popen(_generate(cfg, run), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while len(srv.requests) - before < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err
        assert "Stopped by SIGTERM" in err and "Run the same command again to resume" in err
        assert "Traceback" not in err
        assert len(pd.read_parquet(run / "dialogues.parquet")) >= 1  # flushed, batch not full
        resumed = subprocess.run(_generate(cfg, run), capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stderr
    ref = pd.read_parquet(reference / "turns.parquet").drop(columns=["latency_s"])
    got = pd.read_parquet(run / "turns.parquet").drop(columns=["latency_s"])
    pd.testing.assert_frame_equal(got, ref)


def test_a_corrupted_part_is_redone_by_generate_and_refused_by_eval(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    run = tmp_path / "run"
    cfg = _config(tmp_path, server.base_url, personas={"n": 3})
    args = ["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]
    assert main(args) == 0
    before = pd.read_parquet(run / "turns.parquet")
    (part,) = (run / "turns.parquet").glob("part-*.parquet")
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the file
    part.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    assert "damaged parts: turns.parquet/" in capsys.readouterr().err
    assert main(args) == 0  # redone, from the cache
    pd.testing.assert_frame_equal(pd.read_parquet(run / "turns.parquet").drop(columns=["latency_s"]),
                                  before.drop(columns=["latency_s"]))


def test_a_damaged_cache_is_a_clear_error(server: Any, tmp_path: Path, capsys: Any) -> None:
    run = tmp_path / "run"
    cfg = _config(tmp_path, server.base_url, personas={"n": 1})
    args = ["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]
    assert main(args) == 0
    (run / "cache.sqlite").write_bytes(b"this is not a database" * 100)
    for side in run.glob("cache.sqlite-*"):
        side.unlink()
    assert main([*args, "--personas", "1"]) == 2
    assert "cache.sqlite is damaged" in capsys.readouterr().err


def test_unwritable_outputs_are_exit_2_and_leave_nothing_behind(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    cfg = _config(tmp_path, server.base_url, personas={"n": 1})
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o555)
    try:
        cases = [(a_file, "is a file"), (a_file / "run", "Not a directory")]
        if os.geteuid() != 0:  # root writes anywhere: nothing to refuse
            cases.append((readonly / "run", "Permission denied"))
        for out, message in cases:
            code = main(["generate", "--config", str(cfg), "--out", str(out), "--no-progress"])
            err = capsys.readouterr().err
            assert code == 2 and message in err and "Traceback" not in err, (out, err)
        assert a_file.read_text() == "x" and not list(readonly.iterdir())
    finally:
        readonly.chmod(0o755)


def test_absurd_counts_and_zero_concurrency_are_refused_at_once_naming_the_flag(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    for extra in ([], ["--dry-run"]):
        assert main(_quick(server.base_url, tmp_path, "--personas", "1000000000", *extra)) == 2
        err = capsys.readouterr().err
        assert "--personas (personas.n)" in err or "engine.max_planned_dialogues" in err
        assert "1,000,000,000" in err
    assert main(_quick(server.base_url, tmp_path, "--concurrency", "0")) == 2
    assert "--concurrency (backends.endpoint.max_concurrency)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_status_and_version(server: Any, tmp_path: Path, capsys: Any) -> None:
    run = tmp_path / "run"
    assert main(_quick(server.base_url, tmp_path)) == 0
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert "2 done of 2 planned; 0 quarantined; 0 to do" in out and "writer:       none" in out
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("spasm ")


def test_errors_of_dialogues_that_later_succeeded_are_not_kept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with TestServer(FaultPlan(rate_500=1.0)) as srv:
        cfg = _config(tmp_path, srv.base_url, personas={"n": 2},
                      backends={"srv": {"kind": "openai", "base_url": srv.base_url, "model": "m",
                                        "max_attempts": 1}})
        assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 1
        assert len(pd.read_parquet(run / "errors.parquet")) == 2
        srv.set_plan(FaultPlan())
        assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 0
    assert pd.read_parquet(run / "errors.parquet").empty
    assert len(pd.read_parquet(run / "dialogues.parquet")) == 2


def test_import_force_into_a_generated_run_and_personas_into_a_directory_are_refused(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    run = tmp_path / "run"
    assert main(_quick(server.base_url, tmp_path)) == 0
    before = sorted(p.name for p in run.iterdir())
    sample = Path(__file__).parent / "data" / "spasm_release_sample.jsonl"
    capsys.readouterr()
    assert main(["import", str(sample), "--out", str(run), "--force"]) == 2
    assert "holds a generated run" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before
    target = tmp_path / "a-dir"
    target.mkdir()
    assert main(["personas", "--n", "2", "--out", str(target)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert not list(target.iterdir()) and not list(tmp_path.glob(".a-dir*"))

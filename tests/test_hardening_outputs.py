"""Hostile conditions: outputs that would destroy what they land
on, interrupted replacements, signals and closed pipes, and the smaller cases.

Through the real CLI (in-process, or in subprocesses where processes matter) against the
loopback test server; what is written is read back from disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spasm.backends.openai_compat import PREFLIGHT_PROMPT
from spasm.cli import main
from spasm.dataset.outputs import OUTPUT_MARKER, replacement_leftovers
from spasm.testing import TestServer
from tests.conftest import endpoint_config

ROOT = Path(__file__).resolve().parent.parent


def _config(tmp: Path, base_url: str, name: str = "c.json", **overrides: Any) -> Path:
    cfg = tmp / name
    cfg.write_text(json.dumps(endpoint_config(base_url, **overrides)))
    return cfg


def _generate(cfg: Path, run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spasm", "generate", "--config", str(cfg), "--out", str(run),
            "--no-progress", *extra]


def _digest(path: Path) -> dict[str, str]:
    """Every file under ``path`` (or ``path`` itself) with its sha256: what "unchanged" means."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of 3 personas (one dialogue each), generated through the CLI."""
    tmp = tmp_path_factory.mktemp("finished")
    with TestServer() as srv:
        cfg = _config(tmp, srv.base_url)
        assert main(["generate", "--config", str(cfg), "--out", str(tmp / "run"), "--no-progress"]) == 0
    return tmp / "run"


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    """A private copy of the finished run (tests may try to damage it)."""
    return Path(shutil.copytree(finished, tmp_path / "run"))


# -- outputs never destroy what they land on ---------------------------------------------------
def test_export_overwrite_never_deletes_a_run_or_a_folder_of_other_files(
    run: Path, tmp_path: Path, capsys: Any
) -> None:
    other = Path(shutil.copytree(run, tmp_path / "other"))
    before = _digest(other)
    assert main(["export", str(run), "--out", str(other), "--overwrite"]) == 2
    assert "is a run directory" in capsys.readouterr().err
    assert _digest(other) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert main(["export", str(run), "--out", str(mine), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "--overwrite replaces only an earlier spasm export output" in err and "Traceback" not in err
    assert (mine / "thesis.tex").read_text() == "years of work"
    # A folder that holds runs (runs/) is not an export either.
    assert main(["export", str(run), "--out", str(tmp_path), "--overwrite"]) == 2
    assert _digest(other) == before and run.is_dir()
    # What export wrote, export may replace: its marker says so.
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert json.loads((out / OUTPUT_MARKER).read_text()) == {"written_by": "spasm export"}
    assert main(["export", str(run), "--out", str(out), "--format", "openai", "--overwrite"]) == 0
    assert len(list((out / "openai").glob("train-*.jsonl"))) == 1 and not (out / "sharegpt").exists()
    assert not list(tmp_path.glob(".export.*"))


def test_eval_card_personas_and_generate_never_write_into_a_runs_tables_or_over_its_files(
    run: Path, tmp_path: Path, capsys: Any
) -> None:
    before = _digest(run)
    with TestServer() as srv:
        cfg = _config(tmp_path, srv.base_url, seed=9)
        for flags in ([], ["--overwrite"]):
            argv = ["generate", "--config", str(cfg), "--out", str(run / "turns.parquet"),
                    "--no-progress", *flags]
            assert main(argv) == 2
            assert "inside the run" in capsys.readouterr().err
    cases = [
        ["eval", str(run), "--out", str(run / "turns.parquet"), "--no-progress"],
        ["eval", str(run), "--out", str(run), "--no-progress"],
        ["card", str(run), "--out", str(run / "manifest.json")],
        ["card", str(run), "--out", str(run / "config.json")],
        ["personas", "--n", "2", "--out", str(run / "personas.parquet" / "part-x.parquet")],
        ["personas", "--n", "2", "--out", str(run / "extra.parquet")],
        ["personas", "--n", "2", "--out", str(run / ".commits" / "p.parquet")],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err, argv
        assert "inside the run" in err or "is a run directory" in err, (argv, err)
    assert _digest(run) == before


def test_generate_overwrite_and_import_force_replace_only_runs_of_their_own(
    server: TestServer, tmp_path: Path, capsys: Any
) -> None:
    cfg = _config(tmp_path, server.base_url)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "notes.md").write_text("keep me")
    assert main(["generate", "--config", str(cfg), "--out", str(docs), "--overwrite",
                 "--no-progress"]) == 2
    assert "never writes over other files, even with --overwrite" in capsys.readouterr().err
    sample = ROOT / "tests" / "data" / "spasm_release_sample.jsonl"
    assert main(["import", str(sample), "--out", str(docs), "--force"]) == 2
    assert "not a spasm run directory" in capsys.readouterr().err
    assert [p.name for p in docs.iterdir()] == ["notes.md"]
    # An earlier import is replaced by --force.
    imported = tmp_path / "imported"
    assert main(["import", str(sample), "--out", str(imported)]) == 0
    assert main(["import", str(sample), "--out", str(imported), "--force"]) == 0


@pytest.mark.e2e
def test_eval_replaces_its_own_output_but_not_someone_elses(run: Path, tmp_path: Path,
                                                            capsys: Any) -> None:
    pytest.importorskip("sklearn")
    out = tmp_path / "report"
    out.mkdir()
    (out / "draft.txt").write_text("mine")
    assert main(["eval", str(run), "--out", str(out), "--no-progress"]) == 2
    assert "files written by something other than spasm eval" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["draft.txt"]
    assert main(["eval", str(run), "--no-progress"]) == 0  # RUN/eval, the default
    assert main(["eval", str(run), "--no-progress"]) == 0  # and again: its own output
    assert json.loads((run / "eval" / OUTPUT_MARKER).read_text())["written_by"] == "spasm eval"


# -- interrupted replacements, signals, closed pipes -------------------------------------------
def _wait_for(check: Any, proc: subprocess.Popen[str], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"exited {proc.returncode} before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.01)


@pytest.mark.e2e
def test_a_kill_9_during_generate_overwrite_is_reported_by_status_and_undone_by_a_rerun(
    run: Path, tmp_path: Path, capsys: Any
) -> None:
    before = pd.read_parquet(run / "dialogues.parquet").sort_values("dialogue_id")
    commits = _digest(run / ".commits")
    cfg_file = tmp_path / "c.json"
    old = json.loads((run / "config.json").read_text())["config"]
    # The replacement's calls (all but its preflight) wait: it is killed before its first dialogue.
    release = threading.Event()

    def stall(request: dict[str, Any]) -> str:
        if PREFLIGHT_PROMPT not in json.dumps(request):
            release.wait(60)
        return "ok"

    with TestServer(reply=stall) as slow:
        new_cfg = _config(tmp_path, slow.base_url, name="new.json", seed=8)
        proc = subprocess.Popen(_generate(new_cfg, run, "--overwrite"), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            _wait_for(lambda: replacement_leftovers(run) and (run / "config.json").exists(), proc,
                      "the old run moved aside")
        finally:
            proc.kill()
            proc.wait()
            release.set()
    aside = replacement_leftovers(run)
    assert len(aside) == 1 and (aside[0] / "dialogues.parquet").is_dir()
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"REPLACED:     an interrupted --overwrite left the previous run at {aside[0]}" in out
    # A rerun restores the old run first (then refuses to resume it with another config) ...
    with TestServer() as srv:
        old["backends"]["srv"]["base_url"] = srv.base_url
        cfg_file.write_text(json.dumps(old))
        assert main(["generate", "--config", str(cfg_file), "--out", str(run), "--no-progress"]) == 2
        assert "holds a run with a different config" in capsys.readouterr().err
        assert not replacement_leftovers(run)
        after = pd.read_parquet(run / "dialogues.parquet").sort_values("dialogue_id")
        pd.testing.assert_frame_equal(after.reset_index(drop=True), before.reset_index(drop=True))
        assert _digest(run / ".commits") == commits
        # ... and the interrupted replacement, run again, replaces it for good.
        assert main(["generate", "--config", str(cfg_file), "--out", str(run), "--no-progress",
                     "--overwrite"]) == 0
    assert not replacement_leftovers(run)
    assert main(["status", str(run)]) == 0
    assert "REPLACED" not in capsys.readouterr().out


def test_status_names_a_run_that_only_survives_aside(run: Path, capsys: Any) -> None:
    aside = run.parent / f".{run.name}.replaced-0badf00d"
    os.replace(run, aside)  # killed between the move aside and the new directory
    assert main(["status", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"left the previous run at {aside}" in err and "Traceback" not in err


@pytest.mark.e2e
def test_export_piped_into_head_exits_0_and_writes_the_export(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    proc = subprocess.Popen([sys.executable, "-m", "spasm", "export", str(run), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line (`| head -0`)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert (out / "openai" / "train.jsonl").exists()


@pytest.mark.e2e
def test_a_sigterm_while_a_finished_merge_shuts_down_does_not_turn_it_into_143(
    server: TestServer, tmp_path: Path
) -> None:
    cfg = _config(tmp_path, server.base_url)
    shards = [tmp_path / f"s{i}" for i in range(2)]
    for i, shard in enumerate(shards):
        assert main(["generate", "--config", str(cfg), "--out", str(shard), "--shard", f"{i}/2",
                     "--no-progress"]) == 0
    out = tmp_path / "merged"
    # A SIGTERM that lands after the command finished, during Python's shutdown (`timeout`, a
    # scheduler): registered first, this atexit handler runs last, in the middle of it.
    script = (
        "import atexit, os, signal, sys, time\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.5)))\n"
        f"sys.argv = ['spasm', 'merge', {str(shards[0])!r}, {str(shards[1])!r}, '--out', {str(out)!r}]\n"
        "from spasm.cli import entrypoint\n"
        "entrypoint()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("merged 2 shards") and (out / "dialogues.parquet").is_dir()


@pytest.mark.e2e
def test_sigterm_during_executor_ray_exits_143_with_the_resume_hint(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    release = threading.Event()

    def stall(request: dict[str, Any]) -> str:
        if PREFLIGHT_PROMPT not in json.dumps(request):
            release.wait(120)
        return "ok"

    with TestServer(reply=stall) as srv:
        cfg = _config(tmp_path, srv.base_url, personas={"n": 2})
        run = tmp_path / "run"
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        proc = subprocess.Popen(_generate(cfg, run, "--executor", "ray", "--shards", "2"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            _wait_for(lambda: any((run / "shards").glob("*/config.json")), proc,
                      "a shard started", timeout=300)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            release.set()
    assert proc.returncode == 143, err
    assert "Stopped by SIGTERM" in err and "Run the same command again to resume" in err
    assert "SIGTERM received" not in err and "Traceback" not in err


# -- the smaller cases -------------------------------------------------------------------------
def test_resume_with_overwrite_and_a_negative_pilot_are_refused(run: Path, capsys: Any) -> None:
    before = _digest(run)
    cfg = ["--config", str(run.parent / "none.yaml"), "--out", str(run), "--no-progress"]
    assert main(["generate", *cfg, "--resume", "--overwrite"]) == 2
    assert "--resume continues the run in --out and --overwrite replaces it" in capsys.readouterr().err
    assert main(["generate", *cfg, "--dry-run", "--pilot", "-1"]) == 2
    assert "--pilot -1" in capsys.readouterr().err
    assert _digest(run) == before


def test_a_large_dry_run_shows_its_persona_drawing(tmp_path: Path, capsys: Any) -> None:
    import anyio

    from spasm.engine import Engine
    from tests.conftest import config_from

    config = config_from(endpoint_config("http://127.0.0.1:9/v1", personas={"n": 600}))
    dry = anyio.run(Engine(config, tmp_path / "run", progress=True).dry_run)
    assert sum(e.dialogues for e in dry.pairings) == 600
    assert "drawing personas" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_status_of_a_directory_that_is_no_run_says_so(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "notes.txt").write_text("x")
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not a spasm run directory" in err and "safe to resume" not in err


@pytest.mark.parametrize("fields", [
    "fields: {}",
    'fields: {first_name: {type: categorical, values: [""]}}',
    "fields: {domain: {type: categorical, values: [{value: a, concerns: []}]}, "
    "concern: {type: derived, from: domain.concerns}}",
])
def test_a_schema_with_an_empty_pool_is_a_schema_error(tmp_path: Path, capsys: Any, fields: str) -> None:
    schema = tmp_path / "s.yaml"
    schema.write_text(f'schema_version: "1.0"\nname: t\n{fields}\n')
    out = tmp_path / "p.parquet"
    assert main(["personas", "--n", "1", "--out", str(out), "--schema", str(schema)]) == 2
    err = capsys.readouterr().err
    assert str(schema) in err and "Traceback" not in err and not out.exists()


def test_a_schema_without_identity_fields_gets_no_empty_you_are(tmp_path: Path) -> None:
    schema = tmp_path / "s.yaml"
    schema.write_text('schema_version: "1.0"\nname: t\nfields: {domain: {type: categorical, '
                      'values: [{value: taxes, concerns: ["my refund is late"]}]}, '
                      "concern: {type: derived, from: domain.concerns}}\n")
    out = tmp_path / "p.parquet"
    assert main(["personas", "--n", "2", "--out", str(out), "--schema", str(schema)]) == 0
    cards = pd.read_parquet(out).card.tolist()
    assert cards and all("You are ." not in c and c.startswith("You have come to talk about taxes")
                         for c in cards)


def test_a_schema_edited_between_passes_is_reported(
    server: TestServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    schema = tmp_path / "persona.yaml"
    schema.write_text((ROOT / "schemas" / "persona.yaml").read_text(encoding="utf-8"))
    cfg = _config(tmp_path, server.base_url, personas={"n": 2, "schema_file": str(schema)})
    argv = ["generate", "--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]
    assert main(argv) == 0
    schema.write_text(schema.read_text() + "\n# a comment is no change\n")
    assert main(argv) == 0
    assert "persona schema" not in caplog.text
    text = schema.read_text()
    assert '{value: "Retiree", weight: 1.5}' in text
    schema.write_text(text.replace('{value: "Retiree", weight: 1.5}', '{value: "Retiree", weight: 3}'))
    assert main(argv) == 0
    assert f"the persona schema {schema} changed since" in caplog.text
    assert "--overwrite" in caplog.text


@pytest.mark.parametrize("pid", ["..", "a/b", ".", "  ", "x\\y", "tab\there"])
def test_import_refuses_persona_ids_that_are_paths(tmp_path: Path, capsys: Any, pid: str) -> None:
    release = tmp_path / "r.jsonl"
    release.write_text(json.dumps({"persona_id": pid, "conversation_id": 0, "turns": [
        {"speaker": "client", "turn_index": 0, "text": "hi"}]}) + "\n")
    out = tmp_path / "run"
    assert main(["import", str(release), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is not an id" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".run*"))


@pytest.mark.parametrize(("text", "address"), [
    ("write to ｊｏｈｎ＠ｅｘａｍｐｌｅ．ｃｏｍ today", "ｊｏｈｎ＠ｅｘａｍｐｌｅ．ｃｏｍ"),
    ("write to john [at] example [dot] com today", "john [at] example [dot] com"),
    ("write to john(at)example.com today", "john(at)example.com"),
    ("call ＋４４ ２０ ７９４６ ０９５８ today", "＋４４ ２０ ７９４６ ０９５８"),
])
def test_fullwidth_and_spelled_out_contacts_are_found_and_redacted(text: str, address: str) -> None:
    from spasm.export.scans import ScanContext, redact, scan_text

    found = [f for f in scan_text(text, ScanContext()) if f.redaction is not None]
    assert [f.evidence for f in found] == [address]
    redacted, _ = redact(text, found)
    assert redacted.startswith(text.split(address)[0]) and redacted.endswith(" today")
    assert address not in redacted and "[" in redacted


def test_identical_exports_write_identical_card_json(run: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["export", str(run), "--out", str(a)]) == 0
    assert main(["export", str(run), "--out", str(b)]) == 0  # the QA scan runs (and dates) again
    assert (a / "card.json").read_bytes() == (b / "card.json").read_bytes()


# -- the viewer --------------------------------------------------------------------------------
def _view_status(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data, headers=headers or {},
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_the_viewer_on_another_loopback_address_serves_its_url(run: Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("duckdb")
    from spasm.viewer.server import ViewerServer

    with ViewerServer(run, host="127.0.0.2") as srv:
        assert srv.base_url.startswith("http://127.0.0.2:")
        assert _view_status(srv.url) == 200
        # A DNS name pointed at the address is still refused (rebinding).
        assert _view_status(srv.url, headers={"Host": f"evil.example:{srv.port}"}) == 421


def test_a_failed_view_start_leaves_no_temporary_folder(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("duckdb")
    import socket
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["view", str(run), "--port", str(port), "--no-browser"]) == 2
    assert "is in use" in capsys.readouterr().err
    assert list(temp.iterdir()) == []


def test_the_viewer_refuses_a_label_from_another_port_on_127_0_0_1(run: Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("duckdb")
    from spasm.viewer.server import ViewerServer

    did = str(pd.read_parquet(run / "dialogues.parquet").dialogue_id.iloc[0])
    body = json.dumps({"dialogue_id": did, "annotator": "ana", "echoing": "none"}).encode()
    with ViewerServer(run) as srv:
        url = srv.base_url + "/api/labels"
        json_type = {"Content-Type": "application/json"}
        other = f"http://127.0.0.1:{srv.port + 1 if srv.port < 65535 else srv.port - 1}"
        assert _view_status(url, body, {**json_type, "Origin": other}) == 403
        assert _view_status(url, body, {**json_type, "Origin": "https://127.0.0.1:" + str(srv.port)}) == 403
        assert _view_status(url, body, {**json_type, "Origin": srv.base_url}) == 201

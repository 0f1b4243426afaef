"""Every call of your agent (``kind: python``) has a bound that holds, and the agent cannot end
spasm: a plain function that blocks, an ``async`` one that blocks its
event loop, one that calls ``sys.exit()`` or raises ``KeyboardInterrupt`` during a call or when
it is imported. Through the real CLI in subprocesses where the process's exit is the point
(their ``timeout`` only catches a hang), against the loopback test server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spasm.cli import main
from spasm.testing import TestServer
from tests.conftest import endpoint_config

ROOT = Path(__file__).resolve().parents[1]

AGENTS = textwrap.dedent('''
    import sys
    import time
    from pathlib import Path

    def _mark():
        Path(__file__).with_suffix(".called").write_text("called")

    def blocks(messages, context):
        _mark()
        time.sleep(3600)

    async def blocks_its_loop(messages, context):
        _mark()
        time.sleep(3600)

    def exits(messages, context):
        sys.exit(0)

    async def exits_async(messages, context):
        sys.exit(3)

    def interrupts(messages, context):
        raise KeyboardInterrupt

    async def interrupts_async(messages, context):
        raise KeyboardInterrupt
''')


def _config(tmp_path: Path, base_url: str, target: str, **backend: Any) -> Path:
    agents = tmp_path / "agents.py"
    agents.write_text(AGENTS)
    data = endpoint_config(base_url, personas={"n": 2})
    data["backends"]["bot"] = {"kind": "python", "target": f"{agents}:{target}", **backend}
    data["pairings"] = [{"client": "srv", "responder": "bot"}]
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(data))
    return cfg


def _generate(cfg: Path, run: Path) -> list[str]:
    return [sys.executable, "-m", "spasm", "generate", "--config", str(cfg), "--out", str(run),
            "--no-progress"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _errors(run: Path) -> pd.DataFrame:
    return pd.read_parquet(run / "errors.parquet")


@pytest.mark.e2e
@pytest.mark.parametrize("target, said", [
    ("blocks", "the call is abandoned: its thread runs on until the function returns"),
    ("blocks_its_loop", "its event loop has been blocked for"),
])
def test_a_blocking_agent_times_out_and_the_command_exits(
        tmp_path: Path, target: str, said: str) -> None:
    """Once a plain function's thread was abandoned the process never exited (it waited for
    it); an async function that blocked spasm's loop hung with no bound at all."""
    with TestServer() as srv:
        cfg = _config(tmp_path, srv.base_url, target, timeout_s=1.5, max_attempts=1)
        run = tmp_path / "run"
        done = subprocess.run(_generate(cfg, run), capture_output=True, text=True, env=_env(),
                              timeout=240)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    errors = _errors(run)
    assert len(errors) == 2 and set(errors.error_type) == {"TimeoutBackendError"}
    assert all("did not return within timeout_s=1.5s" in m and said in m for m in errors.error)


@pytest.mark.e2e
def test_sigterm_while_an_async_agent_blocks_its_loop_stops_cleanly(tmp_path: Path) -> None:
    with TestServer() as srv:
        cfg = _config(tmp_path, srv.base_url, "blocks_its_loop", timeout_s=3000, max_attempts=1)
        run = tmp_path / "run"
        proc = subprocess.Popen(_generate(cfg, run), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_env())
        called = tmp_path / "agents.called"
        for _ in range(2400):  # until the agent is inside a call (or the command ended)
            if called.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert called.exists(), proc.communicate(timeout=60)
        time.sleep(1.5)  # its loop is blocked now, and spasm's is not
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Stopped by SIGTERM" in err and "Traceback" not in err


@pytest.mark.parametrize("target, said", [
    ("exits", "called sys.exit(0)"), ("exits_async", "called sys.exit(3)"),
    ("interrupts", "raised KeyboardInterrupt"), ("interrupts_async", "raised KeyboardInterrupt"),
])
def test_an_agent_that_exits_or_interrupts_during_a_call_fails_its_dialogues_not_spasm(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, said: str) -> None:
    with TestServer() as srv:
        cfg = _config(tmp_path, srv.base_url, target)
        run = tmp_path / "run"
        assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Interrupted" not in err
    errors = _errors(run)
    assert len(errors) == 2 and set(errors.error_type) == {"FatalBackendError"}
    where = f"at {tmp_path / 'agents.py'}:"
    assert all(said in m and where in m and "spasm does not exit on its behalf" in m
               for m in errors.error), list(errors.message)
    calls = pd.read_parquet(run / "calls.parquet")
    assert (calls[calls.backend == "bot"].attempt == 1).all()  # not retried: it is not transient


@pytest.mark.parametrize("kind", ["file", "module"])
def test_a_target_that_exits_when_imported_is_exit_2_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        kind: str) -> None:
    """It was exit 0 with no output and no dataset."""
    (tmp_path / "script_agent.py").write_text(
        "import sys\n\ndef respond(messages, context):\n    return 'hi'\n\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    target = (f"{tmp_path / 'script_agent.py'}:respond" if kind == "file"
              else "script_agent:respond")
    data = endpoint_config("http://127.0.0.1:9/v1")
    data["backends"]["bot"] = {"kind": "python", "target": target}
    data["pairings"] = [{"client": "srv", "responder": "bot"}]
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(data))
    run = tmp_path / "run"
    assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"target {target!r}: importing" in err and "called sys.exit(0) at " in err, err
    assert "script_agent.py:6" in err and "if __name__ ==" in err
    assert not run.exists()


def test_an_interrupt_before_the_run_directory_exists_says_nothing_was_saved(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C while the target is imported: no run directory was made, so the message must
    not say completed dialogues are saved in it."""
    (tmp_path / "slow_agent.py").write_text(
        "def respond(messages, context):\n    return 'hi'\n\nraise KeyboardInterrupt\n")
    data = endpoint_config("http://127.0.0.1:9/v1")
    data["backends"]["bot"] = {"kind": "python", "target": f"{tmp_path / 'slow_agent.py'}:respond"}
    data["pairings"] = [{"client": "srv", "responder": "bot"}]
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(data))
    run = tmp_path / "run"
    assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 130
    err = capsys.readouterr().err
    assert not run.exists()
    assert "saved in" not in err and f"Nothing was written ({run} was not created)" in err, err


TOOLS_SCRIPT = textwrap.dedent('''
    import sys
    import time

    import anyio

    import spasm
    from spasm.tools import invoke


    @spasm.tool(timeout_s=0.5)
    def blocks(world: dict) -> str:
        """Block."""
        time.sleep(3600)
        return "never"


    @spasm.tool(timeout_s=0.5)
    async def blocks_its_loop(world: dict) -> str:
        """Block the loop."""
        time.sleep(3600)
        return "never"


    @spasm.tool()
    def exits(world: dict) -> str:
        """Exit."""
        sys.exit(4)


    @spasm.tool()
    async def interrupts(world: dict) -> str:
        """Interrupt."""
        raise KeyboardInterrupt


    async def main():
        for t in (blocks, blocks_its_loop, exits, interrupts, blocks):
            outcome = await invoke(t, {"n": 1}, "{}")
            print(t.name, "|", outcome.error, flush=True)

    anyio.run(main)
    print("done", flush=True)
''')


@pytest.mark.e2e
def test_a_tool_that_blocks_or_exits_is_a_result_with_an_error_and_the_process_exits(
        tmp_path: Path) -> None:
    """The neighbour of the agent's bound: a tool is the user's code too. A blocking plain tool
    left a worker thread the interpreter waited for at exit; an async one that blocked the loop
    hung the run; sys.exit() in a tool ended the whole process."""
    script = tmp_path / "tools_bounds.py"
    script.write_text(TOOLS_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=_env(), timeout=240)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" | ", 1) for line in done.stdout.splitlines() if " | " in line)
    assert lines["blocks"] == "the tool did not return within timeout_s=0.5s"
    assert lines["blocks_its_loop"] == "the tool did not return within timeout_s=0.5s"
    assert lines["exits"].startswith("the tool called sys.exit(4) at ") and "tools_bounds.py:" in \
        lines["exits"]
    assert lines["interrupts"].startswith("the tool raised KeyboardInterrupt at ")
    assert done.stdout.splitlines()[-1] == "done" and "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["file", "module"])
def test_a_tools_module_that_exits_when_imported_is_exit_2_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    from spasm.errors import ConfigError
    from spasm.tools import load_tools

    (tmp_path / "script_tools.py").write_text("import sys\n\nsys.exit(5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = str(tmp_path / "script_tools.py") if kind == "file" else "script_tools"
    with pytest.raises(ConfigError, match=r"tools entry .*script_tools.* called sys\.exit\(5\) at "
                                          r".*script_tools\.py:3: a module spasm imports must not exit"):
        load_tools([entry])

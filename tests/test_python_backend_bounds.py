"""Every call of your agent (``kind: python``) has a bound that holds, and the agent cannot end
spasm (issue 28 items 3 and 4): a plain function that blocks, an ``async`` one that blocks its
event loop, one that calls ``sys.exit()`` or raises ``KeyboardInterrupt`` during a call or when
it is imported. Through the real CLI in subprocesses where the process's exit is the point
(their ``timeout`` only catches a hang), against the loopback test server."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spasm.cli import main
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

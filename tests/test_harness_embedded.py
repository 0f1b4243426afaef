"""The harness on the embedded SmolLM2 model: every structured schema must compile to a
llama.cpp grammar and a level-E dialogue must finish, whatever the small model writes.

Grammar-constrained decoding makes this a minute on a quiet 2-core machine and far more on a
busy one, so it runs only with ``SPASM_SLOW=1`` (the schemas' shape is covered offline by the
server-based tests).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pandas as pd
import pytest

from spasm.config import parse_config
from spasm.engine import Engine
from spasm.harness.level_report import level_report

pytestmark = pytest.mark.e2e


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SPASM_SLOW") != "1", reason="set SPASM_SLOW=1 to run")
def test_level_e_runs_on_the_embedded_model(tmp_path: Path) -> None:
    config = parse_config(
        {
            "name": "emb-harness",
            "seed": 3,
            "personas": {"n": 1},
            "backends": {"embedded": {"kind": "embedded", "n_threads": 2, "n_ctx": 2048}},
            "pairings": [{"client": "embedded", "responder": "embedded"}],
            "dialogue": {"max_turns_per_agent": 2, "max_tokens": 16},
            "termination": {"rules": False},
            "harness": {"levels": ["E"], "window": 2, "stride": 1, "extract_policy": False,
                        "reducer_max_tokens": 96, "checker_max_tokens": 80},
        }
    )
    run = tmp_path / "run"
    summary = anyio.run(Engine(config, run, progress=False).run)
    assert summary.completed == summary.planned == 1 and summary.errors == 0
    turns = pd.read_parquet(run / "turns.parquet")
    calls = pd.read_parquet(run / "calls.parquet")
    assert len(turns) == 4 and turns.state.notna().all() and turns.checker_verdict.notna().all()
    assert {"reducer", "checker"} <= set(calls.role)
    for raw in turns.state:
        json.loads(raw)
    report = level_report(run)
    assert report["levels"]["E"]["dialogues"] == 1

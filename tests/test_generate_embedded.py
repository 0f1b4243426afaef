"""End to end through the embedded SmolLM2 model, in-process (no server, no key)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pandas as pd
import pytest

from spasm.config import parse_config
from spasm.engine import Engine

pytestmark = pytest.mark.e2e


def test_embedded_run_in_process(tmp_path: Path) -> None:
    config = parse_config(
        {
            "name": "emb",
            "seed": 1,
            "personas": {"n": 2},
            "conditions": ["ecp", "concat"],
            "backends": {"embedded": {"kind": "embedded", "n_threads": 2, "n_ctx": 2048}},
            "pairings": [{"client": "embedded", "responder": "embedded"}],
            "dialogue": {"max_turns_per_agent": 2, "max_tokens": 24},
            "termination": {"min_utterances": 4},
        }
    )
    run = tmp_path / "run"
    summary = anyio.run(Engine(config, run, progress=False).run)
    assert summary.completed == summary.planned == 4 and summary.errors == 0
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    turns = pd.read_parquet(run / "turns.parquet")
    calls = pd.read_parquet(run / "calls.parquet")
    assert set(dialogues.client_model) == {"SmolLM2-135M-Instruct"}
    assert (dialogues.n_utterances == 4).all()
    assert (turns.text.str.strip().str.len() > 0).all()
    assert (turns.n_tokens > 0).all()
    assert set(calls.outcome) == {"ok"}
    assert calls.resolved_model.str.contains("gguf").all()

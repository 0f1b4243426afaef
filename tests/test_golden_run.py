"""Behaviour is preserved across refactors: a fixed config on the test server gives the same
personas, dialogues and turns, column for column, as the golden digests recorded in
``tests/golden/run.json``.

The config exercises every generation path: LLM-validated personas, ECP and CONCAT, the
termination judge, harness levels A–E with policy extraction, audits and recall probes.
Columns that measure the machine (``latency_s``) are left out. After a deliberate change of
behaviour, regenerate with ``SPASM_UPDATE_GOLDEN=1 pytest tests/test_golden_run.py`` and say
why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import anyio
import pandas as pd

from spasm.engine import Engine
from spasm.testing import TestServer
from spasm.tokens import counter_source
from tests.conftest import config_from, endpoint_config

GOLDEN = Path(__file__).parent / "golden" / "run.json"
#: Per-table sort keys and columns that vary run to run.
TABLES = {
    "personas": (["persona_id"], set()),
    "dialogues": (["dialogue_id"], set()),
    "turns": (["dialogue_id", "turn_index"], {"latency_s"}),
}


def golden_config(base_url: str) -> dict[str, Any]:
    return endpoint_config(
        base_url,
        personas={"n": 2, "llm_validate": True},
        conditions=["ecp", "concat"],
        dialogue={"max_turns_per_agent": 4, "max_tokens": 40},
        termination={"rules": True, "judge": True, "min_utterances": 4},
        harness={"levels": ["A", "B", "C", "D", "E"], "window": 3, "stride": 2,
                 "extract_policy": True, "audit": True, "recall_probe": True},
    )


def _digest(values: list[Any]) -> str:
    blob = json.dumps(values, sort_keys=True, default=str, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def column_digests(run: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for table, (keys, skip) in TABLES.items():
        df = pd.read_parquet(run / f"{table}.parquet").sort_values(keys).reset_index(drop=True)
        df = df.astype(object).where(df.notna(), None)
        out[table] = {"_rows": str(len(df))}
        out[table].update({c: _digest(df[c].tolist()) for c in df.columns if c not in skip})
    return out


def test_a_fixed_config_gives_the_golden_personas_dialogues_and_turns(tmp_path: Path) -> None:
    with TestServer() as srv:
        summary = anyio.run(Engine(config_from(golden_config(srv.base_url)), tmp_path / "run",
                                   progress=False, sleep_scale=0.0).run)
    assert summary.completed == summary.planned == 20, summary.line()
    got = column_digests(tmp_path / "run")
    if os.environ.get("SPASM_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    if not counter_source().startswith("tiktoken"):
        # Without tiktoken's encodings (an offline machine without ../shared/data/tiktoken) the
        # prefix-cache estimate counts ~4 characters per token: everything else must match.
        for digests in (want, got):
            digests["turns"].pop("cached_prompt_tokens", None)
    diff = {
        f"{t}.{c}": (want.get(t, {}).get(c), got.get(t, {}).get(c))
        for t in set(want) | set(got)
        for c in set(want.get(t, {})) | set(got.get(t, {}))
        if want.get(t, {}).get(c) != got.get(t, {}).get(c)
    }
    assert not diff, f"columns that changed (golden, now): {diff}"

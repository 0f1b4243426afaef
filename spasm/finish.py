"""Finishing a run: the one place that completes a run directory once every dialogue is
stored — empty tables written, parts compacted, end-of-run reports — for the engine, for
``spasm merge`` and for the Ray executor alike (the run format in :mod:`spasm.dataset` knows
none of the reports).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from spasm.config import HarnessConfig
from spasm.dataset.store import RunStore

__all__ = ["complete_run", "write_reports"]


def _stored_harness(run_dir: Path) -> HarnessConfig | None:
    """The harness config a finished run was made with (from its ``config.json``)."""
    try:
        stored = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    cfg = stored.get("config") if isinstance(stored, dict) else None
    harness = cfg.get("harness") if isinstance(cfg, dict) else None
    return HarnessConfig.model_validate(harness) if isinstance(harness, dict) else None


def write_reports(run_dir: Path, harness: HarnessConfig | None = None) -> None:
    """The end-of-run reports of a finished run: the harness level report when the harness
    is on (``harness``: the run's config; read from its ``config.json`` when not given)."""
    harness = harness if harness is not None else _stored_harness(run_dir)
    if harness is None or not harness.active or not (run_dir / "dialogues.parquet").exists():
        return
    from spasm.harness.level_report import level_report

    level_report(run_dir)


def complete_run(
    store: RunStore, run_dir: Path, tables: Iterable[str], harness: HarnessConfig
) -> None:
    """Every table present (empty ones too), each compacted into one sorted part, and the
    end-of-run reports written."""
    store.ensure_tables(tables)
    store.compact_all()
    write_reports(run_dir, harness)

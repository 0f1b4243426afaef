"""Moved to :mod:`spasm.dataset.files`; this name stays until every caller is repointed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa

from spasm.dataset.files import atomic_write_bytes, atomic_write_table, atomic_write_text, publish_mode

__all__ = ["atomic_write_bytes", "atomic_write_parquet", "atomic_write_text", "publish_mode"]


def atomic_write_parquet(df: pd.DataFrame, path: str | Path, schema: pa.Schema | None = None) -> None:
    """Write ``df`` as one Parquet file at ``path`` atomically."""
    atomic_write_table(path, pa.Table.from_pandas(df, schema=schema, preserve_index=False))

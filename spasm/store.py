"""Moved to :mod:`spasm.dataset.store`; this name stays until every caller is repointed."""

from spasm.dataset.files import atomic_write_json as write_json
from spasm.dataset.files import atomic_write_text
from spasm.dataset.rows import SCHEMA_VERSION
from spasm.dataset.store import RunStore

__all__ = ["SCHEMA_VERSION", "RunStore", "atomic_write_text", "write_json"]

"""Moved to :mod:`spasm.dataset.importer`; this name stays until every caller is repointed."""

from spasm.dataset.importer import export_spasm_jsonl, import_spasm_jsonl

__all__ = ["export_spasm_jsonl", "import_spasm_jsonl"]

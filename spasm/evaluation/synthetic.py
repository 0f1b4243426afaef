"""Moved to :mod:`spasm.dataset.synthetic`; this name stays until every caller is repointed."""

from spasm.dataset.synthetic import synthesize_run, write_run

__all__ = ["synthesize_run", "write_run"]

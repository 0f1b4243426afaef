"""``python -m spasm`` is the ``spasm`` command."""

from spasm.cli import entrypoint

entrypoint()

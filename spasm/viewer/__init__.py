"""``spasm view``: a local web app to browse, compare and annotate a run (docs/viewer.md).

==================  =====================================================================
Module              What it does
==================  =====================================================================
``cli``             the ``view`` sub-command
``server``          uvicorn on its own socket, in the foreground or a thread
``app``             the FastAPI app, its templates and error pages
``routes``          the pages and the one write (a label)
``state``           what app and routes share: the run's index, labels, templates, responses
``security``        token, host check, same-origin writes, Content-Security-Policy
``queries``         DuckDB over the run's committed Parquet parts (list, search, one dialogue)
``listing``         the list's filters, sort and paging as a validated query
``annotations``     labels written through the dataset package's RunStore
``pages``           what a dialogue page shows (verification marks, echo evidence)
``charts``          harness state as small SVG charts
==================  =====================================================================

It reads runs only through :mod:`spasm.dataset` (``open_run``, ``Run.files``, ``DialogueView``)
and writes nothing but labels. docs/viewer.md describes it.
"""

from __future__ import annotations

__all__ = ["ViewerServer", "create_app"]


def __getattr__(name: str) -> object:
    # The web stack is an optional extra: import it only when asked for.
    if name == "create_app":
        from spasm.viewer.app import create_app

        return create_app
    if name == "ViewerServer":
        from spasm.viewer.server import ViewerServer

        return ViewerServer
    raise AttributeError(name)

"""What the viewer's app and its routes share: the :class:`ViewerState` state (the run's index, its
labels, the templates), the not-found error and the response helpers.

A leaf under :mod:`spasm.viewer.app` (which builds the app) and :mod:`spasm.viewer.routes`
(which adds the pages), so the two never import each other.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined
from pydantic import ValidationError

from spasm.evaluation.figures import read_figures
from spasm.viewer.annotations import AnnotationBook, LabelIn
from spasm.viewer.eval_view import EvalMetrics, read_eval_metrics
from spasm.viewer.listing import SORTS, ListQuery
from spasm.viewer.queries import RunIndex
from spasm.viewer.security import REPORT_CSP

__all__ = ["ANNOTATOR_COOKIE", "NotFound", "ViewerState", "eval_report", "json_response", "static_file",
           "valid_id"]

_STATIC = {"viewer.css": "text/css; charset=utf-8", "viewer.js": "text/javascript; charset=utf-8"}
_ID = re.compile(r"^[^/\\\x00-\x1f\x7f]{1,300}$")
ANNOTATOR_COOKIE = "spasm_annotator"


class NotFound(Exception):
    """An unknown (or invalid) dialogue id or turn."""


def valid_id(dialogue_id: str) -> str:
    """``dialogue_id`` if it could name a dialogue (no separators, control characters, ``..``);
    otherwise :class:`NotFound`."""
    if not _ID.match(dialogue_id) or ".." in dialogue_id:
        raise NotFound(f"No dialogue {dialogue_id!r} in this run.")
    return dialogue_id


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


class ViewerState:
    """The state behind the app: the run's index, its labels and the templates."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.index = RunIndex(self.run_dir)
        try:
            self.book = AnnotationBook(self.run_dir)
            self.env = Environment(loader=PackageLoader("spasm.viewer", "templates"),
                                   autoescape=True, undefined=StrictUndefined, trim_blocks=True,
                                   lstrip_blocks=True)
            self.env.globals.update(sorts=list(SORTS), run_name=self._run_name())
        except BaseException:  # a failed start leaves no temporary folder behind
            self.index.close()
            raise

    def _run_name(self) -> str:
        name = self.index.snapshot().run.manifest.get("name")
        return str(name) if name else self.run_dir.name

    def close(self) -> None:
        """Release the index (its temporary database)."""
        self.index.close()

    def render(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A page from ``templates/``."""
        return HTMLResponse(self.env.get_template(template).render(**context), status_code=status)

    # -- data for the pages -------------------------------------------------------------------
    def eval_metrics(self) -> EvalMetrics:
        """What the overview can show of eval/metrics.json, and what it cannot read
        (:mod:`spasm.viewer.eval_view`: a foreign or damaged file never fails the page)."""
        return read_eval_metrics(self.run_dir)

    def eval_figures(self) -> list[tuple[str, str]]:
        """(caption, data: URI) of each figure of the eval report, as ``spasm eval`` wrote them
        beside it (none before the run is evaluated)."""
        return [(f.caption, f.data_uri()) for f in read_figures(self.run_dir / "eval")]

    def agreement(self, method: str) -> Any:
        """The live agreement of the labels so far (``None`` without labels)."""
        rows = self.book.all_rows()
        if not rows:
            return None
        import pandas as pd

        from spasm.evaluation.agreement import agreement_report

        labels = pd.DataFrame(rows)
        detectors: dict[str, dict[str, bool]] = {}
        if self.index.facets().has_eval:
            ids = sorted({str(r["dialogue_id"]) for r in rows})
            got = self.index.snapshot().con.cursor().execute(
                "SELECT dialogue_id, echoing FROM dlg WHERE dialogue_id IN (SELECT unnest($ids)) "
                "AND echoing IS NOT NULL", {"ids": ids}).fetchall()
            detectors["judge" if method == "judge" else "rule"] = {str(d): bool(e) for d, e in got}
        return agreement_report(labels, detectors)

    def list_query(self, request: Request, raw: str | None = None) -> ListQuery:
        """The list query of a request (or of its ``from`` parameter)."""
        if raw is None:
            return ListQuery.from_params(request.query_params.multi_items())
        from urllib.parse import parse_qsl

        return ListQuery.from_params(parse_qsl(raw, keep_blank_values=False))

    def annotator(self, request: Request) -> str | None:
        """The annotator name the browser sent (cookie set by viewer.js), if valid."""
        name = request.cookies.get(ANNOTATOR_COOKIE)
        if not name:
            return None
        try:
            return LabelIn(dialogue_id="-", annotator=name).annotator
        except ValidationError:
            return None


def static_file(name: str) -> Response:
    """One of the two static files, by its fixed name (anything else: 404)."""
    if name not in _STATIC:
        raise NotFound("No such file.")
    body = (Path(__file__).parent / "static" / name).read_bytes()
    return Response(body, media_type=_STATIC[name], headers={"Cache-Control": "max-age=300"})


def eval_report(run_dir: Path) -> Response:
    """The eval report, sandboxed (no script, no network)."""
    path = run_dir / "eval" / "report.html"
    if not path.is_file():
        raise NotFound("This run has no eval report yet: run `spasm eval RUN_DIR`.")
    return HTMLResponse(path.read_text(encoding="utf-8", errors="replace"),
                        headers={"Content-Security-Policy": REPORT_CSP})


def json_response(data: Any, status: int = 200) -> Response:
    """JSON with datetimes as ISO strings."""
    return Response(json.dumps(data, default=_json_default), status_code=status,
                    media_type="application/json")

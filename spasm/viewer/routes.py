"""The viewer's pages and its one write (see :mod:`spasm.viewer.app` for the route table), over
the shared :class:`~spasm.viewer.state.ViewerState`.

Handlers are plain functions: FastAPI runs them in its thread pool, where the blocking DuckDB
queries belong.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import ValidationError

from spasm.errors import UserError
from spasm.viewer import actions, pages
from spasm.viewer.annotations import LabelIn, RunBusy
from spasm.viewer.charts import harness_charts
from spasm.viewer.state import NotFound, ViewerState, eval_report, json_response, static_file, valid_id

__all__ = ["add_routes"]


def _labels_json(viewer: ViewerState, dialogue_id: str) -> dict[str, Any]:
    return {"dialogue_id": dialogue_id, "labels": viewer.book.labels(dialogue_id),
            "history": viewer.book.history_count(dialogue_id)}


def add_routes(app: FastAPI, viewer: ViewerState) -> None:
    """Register every route of the viewer on ``app``."""

    @app.get("/")
    def overview(request: Request) -> Response:
        run = viewer.index.snapshot().run
        evaluated = viewer.eval_metrics()
        metrics = evaluated.data
        method = str(((metrics or {}).get("echoing") or {}).get("method") or "rule")
        return viewer.render(
            "overview.html", request=request, manifest=run.manifest, counts=viewer.index.overview(),
            facets=viewer.index.facets(), metrics=metrics, metrics_problems=evaluated.problems,
            figures=viewer.eval_figures(),
            labels=viewer.book.summary(), agreement=viewer.agreement(method), tables=run.tables(),
            run_dir=str(viewer.run_dir),
        )

    @app.get("/dialogues")
    def dialogue_list(request: Request) -> Response:
        query = viewer.list_query(request)
        me = viewer.annotator(request)
        page = viewer.index.list_page(query, viewer.book.status_table(me))
        return viewer.render(
            "list.html", request=request, query=query, page=page, facets=viewer.index.facets(),
            annotated=viewer.book.annotated(), me=me,
        )

    @app.get("/d/{dialogue_id}")
    def dialogue(request: Request, dialogue_id: str) -> Response:
        view = viewer.index.dialogue(valid_id(dialogue_id))
        if view is None:
            raise NotFound(f"No dialogue {dialogue_id!r} in this run.")
        raw_from = request.query_params.get("from")
        query = viewer.list_query(request, raw_from or "")
        me = viewer.annotator(request)
        prev_id, next_id, position, total = viewer.index.neighbours(
            query, dialogue_id, viewer.book.status_table(me))
        eval_row = viewer.index.eval_row(dialogue_id)
        return viewer.render(
            "dialogue.html", request=request, view=view, row=view.row, persona=view.persona,
            turns=pages.turn_views(view, eval_row), eval_row=eval_row,
            card_leak=pages.card_reached_responder(view), charts=harness_charts(view.turns),
            counterparts=viewer.index.counterparts(view.row), query=query, prev_id=prev_id,
            next_id=next_id, position=position, total=total, labels=viewer.book.labels(dialogue_id),
            history=viewer.book.history_count(dialogue_id), me=me, seats=pages.seat_views(view),
            reasons=pages.reason_summary(view), kinds=pages.seat_kinds(view),
            # A run with tools: each turn's events inline, and the final world beside the gold.
            actions=actions.event_views(view), world=actions.world_view(view),
        )

    @app.get("/d/{dialogue_id}/seen/{turn_index}")
    def seen(request: Request, dialogue_id: str, turn_index: int) -> Response:
        view = viewer.index.dialogue(valid_id(dialogue_id))
        if view is None:
            raise NotFound(f"No dialogue {dialogue_id!r} in this run.")
        position = next((i for i, t in enumerate(view.turns) if t["turn_index"] == turn_index), None)
        if position is None:
            raise NotFound(f"Dialogue {dialogue_id!r} has no turn {turn_index}.")
        template = "seen_fragment.html" if request.query_params.get("fragment") else "seen.html"
        return viewer.render(template, request=request, row=view.row,
                             seen=pages.seen_rows(view, position))

    @app.get("/compare/{dialogue_id}")
    def compare(request: Request, dialogue_id: str) -> Response:
        view = viewer.index.dialogue(valid_id(dialogue_id))
        if view is None:
            raise NotFound(f"No dialogue {dialogue_id!r} in this run.")
        others = viewer.index.counterparts(view.row)
        wanted = [lv for lv in request.query_params.get("levels", "").split(",") if lv]
        shown = [o for o in others if not wanted or o["harness_level"] in wanted]
        columns = []
        for other in shown:
            other_view = viewer.index.dialogue(other["dialogue_id"])
            if other_view is not None:
                columns.append({"info": other, "row": other_view.row,
                                "turns": pages.turn_views(other_view,
                                                          viewer.index.eval_row(other["dialogue_id"]))})
        depth = max((len(c["turns"]) for c in columns), default=0)
        levels = sorted({o["harness_level"] for o in others})
        return viewer.render("compare.html", request=request, row=view.row, persona=view.persona,
                             columns=columns, depth=depth, levels=levels, wanted=wanted,
                             dialogue_id=dialogue_id)

    @app.get("/api/labels/{dialogue_id}")
    def get_labels(dialogue_id: str) -> Response:
        if viewer.index.dialogue(valid_id(dialogue_id)) is None:
            raise NotFound(f"No dialogue {dialogue_id!r} in this run.")
        return json_response(_labels_json(viewer, dialogue_id))

    @app.post("/api/labels")
    async def post_label(request: Request) -> Response:
        try:
            label = LabelIn.model_validate_json(await request.body())
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "body"
            return json_response({"error": f"{where}: {err['msg']}"}, 422)
        from starlette.concurrency import run_in_threadpool

        view = await run_in_threadpool(viewer.index.dialogue, valid_id(label.dialogue_id))
        if view is None:
            raise NotFound(f"No dialogue {label.dialogue_id!r} in this run.")
        if label.echoing is None and label.role_flip is None and not (label.note or "").strip():
            raise UserError("A label needs an echoing choice, a role flip or a note.")
        try:
            await run_in_threadpool(viewer.book.add, label)
        except RunBusy as exc:
            return json_response({"error": str(exc)}, 409)
        return json_response(_labels_json(viewer, label.dialogue_id), 201)

    @app.get("/eval/report.html")
    def report() -> Response:
        return eval_report(viewer.run_dir)

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        return static_file(name)

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

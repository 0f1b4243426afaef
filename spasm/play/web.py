"""A seat in the browser: the play pages of ``spasm view`` (tests/test_play_web.py).

``spasm view RUN`` gets ``/play``: start a dialogue in a seat of the run's config (persona,
scenario, condition), then talk in it; the other seats are the config's agents, through the
same :func:`spasm.play.session.play` as the terminal. Each session is its own run directory,
``<RUN>.play/<session>/run``, beside the run (never inside it).

What is said is never lost: the person's line is written to ``session.json`` (atomically)
before the dialogue is handed it. A refresh reads the session's state again; after a server
restart (or a kill -9 between two turns) the session is run again from the start: the models'
replies come back from the run's request cache and the person's lines from ``session.json``,
so the dialogue reaches the same point and waits for the next line. Nothing waits on the
browser: a tab polls the state (``GET /api/play/<id>``), and a person who goes silent for an
hour finds the dialogue where it was (tests/test_play_browser.py jumps the page's clock an hour).

One writer per turn: a line is taken for the turn the page was shown; a second tab that
answers the same turn is told (409) and shows the state the first one made. The page counts
what a study needs to spot typed-by-an-LLM answers: ``typing_ms``, ``edits`` (deletions) and
``pasted_chars``.

The viewer's guard covers every route (loopback hosts, token, same-origin JSON writes, the
script-free Content-Security-Policy); the writes also need the session's CSRF token (a header
the page's own script sends). Every utterance reaches the page as JSON and is put in with
``textContent``: markup a person or a model writes is shown, never run.
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import ChoiceLoader, Environment, PackageLoader, StrictUndefined

from spasm.backends.base import ChatRequest, Message
from spasm.backends.human import PersonReply
from spasm.config import RunConfig, parse_config
from spasm.dataset.files import atomic_write_json
from spasm.dataset.persona_rows import ID_CARD_COLUMNS, cards_of
from spasm.errors import ParticipantLeft, SpasmError, UserError
from spasm.scenarios import run_scenarios
from spasm.viewer.state import NotFound, ViewerState, json_response, valid_id

__all__ = ["Desk", "add_play_routes"]

#: A session id: what a new session is named (``s`` and 10 hex digits).
_SID = "s"
_PARTNER = {"client": "Responder", "responder": "Client"}
#: Longest line a person may send (a 1 MB paste fits).
MAX_LINE = 2_000_000


class _Closing(BaseException):
    """The server is stopping: the session's dialogue stops where it is (not saved as ended;
    it is run again, from its lines, when the server comes back)."""


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class _View:
    """What the page shows: the seat's frame and the conversation as the seat sees it."""

    status: str = "starting"  # starting | your_turn | thinking | debrief | ended | failed
    frame: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    turn: int | None = None
    detail: str = ""
    #: The scenario's goal, asked about at the end (``debrief``).
    goal: str = ""


class WebSession:
    """One play session: its record on disk, the dialogue's thread and what the page shows."""

    def __init__(self, desk: Desk, sid: str, record: dict[str, Any]) -> None:
        self.desk, self.sid, self.record = desk, sid, record
        self.dir = desk.root / sid
        self.cond = threading.Condition()
        self.view = _View(status="ended" if record.get("finished") else "starting",
                          detail=str(record.get("finished") or ""))
        self.thread: threading.Thread | None = None

    # -- the record ---------------------------------------------------------------------------
    def save(self) -> None:
        atomic_write_json(self.dir / "session.json", self.record)

    def line(self, turn: int) -> dict[str, Any] | None:
        return next((x for x in self.record["lines"] if x["turn"] == turn), None)

    def say(self, turn: int, text: str, typing_ms: int | None, edits: int | None,
            pasted: int | None) -> None:
        """Take the person's line for ``turn`` (saved before the dialogue sees it)."""
        with self.cond:
            if self.view.status != "your_turn" or self.view.turn != turn or self.line(turn):
                raise _Conflict("This turn was already answered (another tab, or a reload); "
                                "the page now shows where the conversation is.")
            self.record["lines"].append({"turn": turn, "text": text, "typing_ms": typing_ms,
                                         "edits": edits, "pasted_chars": pasted, "at": _now()})
            self.save()
            self.view.status = "thinking"
            self.cond.notify_all()

    def answer(self, goal_met: bool | None, rating: int | None) -> None:
        """The person's verdict at the end (saved, then handed to the dialogue's row)."""
        with self.cond:
            if self.view.status != "debrief" or self.record.get("debrief") is not None:
                raise _Conflict("There is no question to answer now; the page shows where the "
                                "session is.")
            answer: dict[str, Any] = {}
            if goal_met is not None:
                answer["person_goal_met"] = goal_met
            if rating is not None:
                answer["person_rating"] = rating
            self.record["debrief"] = answer
            self.save()
            self.view.status = "thinking"
            self.cond.notify_all()

    def end(self) -> None:
        with self.cond:
            if self.record.get("ended") is None:
                self.record["ended"] = "the person ended it on the page"
                self.save()
            self.cond.notify_all()

    # -- the dialogue ---------------------------------------------------------------------------
    def ensure_running(self) -> None:
        """Start (or, after a restart, resume) the dialogue unless it finished."""
        if self.record.get("finished") or (self.thread is not None and self.thread.is_alive()):
            return
        self.thread = threading.Thread(target=self._run, name=f"spasm-play-{self.sid}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from spasm.play.session import play, play_config

        r = self.record
        try:
            setup = play_config(self.desk.config, r["seat"], persona_id=r.get("persona_id"),
                                scenario=r.get("scenario"), condition=r.get("condition"),
                                operator=r["operator"], interface="web")
            prefix: dict[str, dict[int, str]] = {}
            for turn, speaker, text in r.get("prefix") or []:
                prefix.setdefault(speaker, {})[int(turn)] = text
            summary = anyio.run(lambda: play(setup, _WebPerson(self), self.dir / "run",
                                             prefix=prefix))
        except _Closing:
            return
        except (SpasmError, OSError) as exc:
            with self.cond:
                self.view.status, self.view.detail = "failed", str(exc)
            return
        except BaseException as exc:  # an exception group from the engine's task group
            if any(isinstance(e, _Closing) for e in getattr(exc, "exceptions", ())):
                return
            with self.cond:
                self.view.status, self.view.detail = "failed", f"{type(exc).__name__}: {exc}"
            return
        with self.cond:
            done = summary.completed == summary.planned and summary.planned > 0
            detail = summary.line() if done else (summary.failed or "the dialogue was not saved")
            if done:
                r["finished"] = detail
                self.save()
            self.view.status, self.view.detail = ("ended" if done else "failed"), detail
            self.cond.notify_all()

    def state(self) -> dict[str, Any]:
        self.ensure_running()
        with self.cond:
            v = self.view
            return {"sid": self.sid, "status": v.status, "frame": v.frame, "messages": v.messages,
                    "turn": v.turn, "detail": v.detail, "goal": v.goal, "seat": self.record["seat"],
                    "operator": self.record["operator"], "run": str(self.dir / "run")}


class _Conflict(Exception):
    """A line for a turn that is not (or no longer) the person's."""


class _WebPerson:
    """The person behind a web session (:class:`spasm.backends.human.Person`)."""

    def __init__(self, session: WebSession) -> None:
        self.s = session

    def _show(self, request: ChatRequest) -> None:
        ctx = request.context
        speaker = (ctx.speaker if ctx is not None else None) or "client"
        rest = [m for m in request.messages if m["role"] != "system"]
        # The seat opened the dialogue: its first message is how it was asked to begin (under
        # ECP it stays first, before the seat's own opening line).
        opened = bool(rest) and rest[0]["role"] == "user" and (
            (ctx is not None and ctx.turn_index == 0)
            or (len(rest) > 1 and rest[1]["role"] == "assistant"))
        self.s.view.frame = next((m["content"] for m in request.messages
                                  if m["role"] == "system"), "")
        self.s.view.messages = [_message(m, speaker, opened and i == 0)
                                for i, m in enumerate(rest)]

    async def reply(self, request: ChatRequest, backend: str) -> PersonReply:
        s = self.s
        turn = request.context.turn_index if request.context is not None else None
        with s.cond:
            self._show(request)
            s.view.turn = turn
            while True:
                if s.desk.closing:
                    raise _Closing
                line = s.line(turn) if turn is not None else None
                if line is not None:  # said before (a replay after a restart), or just now
                    s.view.status = "thinking"
                    return PersonReply(text=line["text"], typing_ms=line.get("typing_ms"),
                                       edits=line.get("edits"), pasted_chars=line.get("pasted_chars"))
                if s.record.get("ended") is not None:
                    s.view.status = "thinking"
                    raise ParticipantLeft(str(s.record["ended"]))
                s.view.status = "your_turn"
                s.cond.wait(timeout=1.0)

    async def debrief(self, dialogue_id: str, goal: str | None, transcript: Any,
                      reason: str) -> dict[str, Any]:
        """The page asks the goal question (with a scenario) and a 1-5 rating of the partner
        (both may be skipped); a fork also says where it began."""
        s = self.s
        with s.cond:
            seat = s.record["seat"]  # the whole conversation now, the last reply included
            s.view.messages = [
                {"who": "You", "text": text, "side": "self"} if sp == seat else
                {"who": _PARTNER.get(seat, sp) if sp in _PARTNER else sp, "text": text,
                 "side": "other"} for sp, text in transcript]
            s.view.turn, s.view.detail, s.view.goal = None, reason, goal or ""
            while s.record.get("debrief") is None:
                if s.desk.closing:
                    raise _Closing
                s.view.status = "debrief"
                s.cond.wait(timeout=1.0)
            s.view.status = "thinking"
            answer = dict(s.record["debrief"])
        fork = s.record.get("forked_from")
        if fork:
            answer.update(forked_from=fork["dialogue_id"], forked_at=fork["turn"])
        return answer



def _message(m: Message, speaker: str, opening: bool) -> dict[str, str]:
    if m["role"] == "assistant":
        return {"who": "You", "text": m["content"], "side": "self"}
    if opening:
        return {"who": "(how the seat is asked to begin)", "text": m["content"], "side": "note"}
    return {"who": m.get("name") or _PARTNER.get(speaker, "Them"), "text": m["content"],
            "side": "other"}


class Desk:
    """The play sessions of one viewed run: ``<RUN>.play/``, its CSRF token, its sessions."""

    def __init__(self, run_dir: Path, config: RunConfig | None) -> None:
        self.run_dir = run_dir
        self.root = run_dir.parent / f"{run_dir.name}.play"
        self.config_or_none = config
        self.closing = False
        self.sessions: dict[str, WebSession] = {}
        self._lock = threading.Lock()
        token_file = self.root / ".csrf"
        if token_file.is_file():
            self.csrf = token_file.read_text(encoding="utf-8").strip()
        else:
            self.csrf = secrets.token_urlsafe(24)
        if self.root.is_dir():
            for d in sorted(self.root.iterdir()):
                f = d / "session.json"
                if f.is_file():
                    try:
                        self.sessions[d.name] = WebSession(self, d.name, json.loads(f.read_text()))
                    except (OSError, json.JSONDecodeError):
                        continue  # a damaged record: left alone, not served

    @property
    def config(self) -> RunConfig:
        if self.config_or_none is None:
            raise UserError(f"{self.run_dir} has no config.json, so it cannot be played "
                            "(an imported run?); play a run spasm generated")
        return self.config_or_none

    def persona_ids(self) -> list[str]:
        """The ids of the run's personas, in the table's order."""
        from spasm.dataset import open_run

        run = open_run(self.run_dir, verify=False)
        if not run.has("personas"):
            return []
        return [str(p) for p in run.table("personas", ["persona_id"]).column("persona_id").to_pylist()]

    def check_csrf(self, request: Request) -> None:
        given = request.headers.get("x-spasm-csrf", "")
        if not hmac.compare_digest(given.encode(), self.csrf.encode()):
            raise _Forbidden

    def fork_of(self, dialogue_id: str, turn: int) -> dict[str, Any]:
        """What a fork of ``dialogue_id`` at ``turn`` keeps: the seat of that turn's speaker,
        the dialogue's persona, scenario and condition, and the utterances before it."""
        from spasm.dataset import open_run

        view = open_run(self.run_dir, verify=False).dialogue(dialogue_id)
        if view.participants:
            raise UserError("a group dialogue cannot be forked yet; start a new session")
        turns = sorted(view.turns, key=lambda t: t["turn_index"])
        if not 0 <= turn < len(turns):
            raise UserError(f"turn {turn}: {dialogue_id} has turns 0 to {len(turns) - 1}")
        row = view.row
        return {"seat": turns[turn]["speaker"], "persona_id": row["persona_id"],
                "scenario": row.get("scenario_id"), "condition": row["condition"],
                "prefix": [[t["turn_index"], t["speaker"], t["text"]] for t in turns[:turn]],
                "forked_from": {"dialogue_id": dialogue_id, "turn": turn}}

    def new(self, seat: str, persona_id: str | None, scenario: str | None,
            condition: str | None, operator: str | None,
            fork: dict[str, Any] | None = None) -> WebSession:
        from spasm.play.session import new_operator, pick_persona, play_config, seat_of

        config = self.config
        if fork is not None:
            seat, persona_id = fork["seat"], fork["persona_id"]
            scenario, condition = fork["scenario"], fork["condition"]
        seat = seat_of(config, seat)
        if config.participants is None:  # the run's own personas (a group draws its seats)
            persona_id = pick_persona(self.persona_ids(), persona_id)
        elif persona_id is not None:
            raise UserError("persona: a group run draws its seats' personas; leave it out")
        if condition is not None and condition not in config.conditions:
            raise UserError(f"condition {condition!r}: the run's conditions are "
                            f"{', '.join(config.conditions)}")
        play_config(config, seat, persona_id=persona_id, scenario=scenario, condition=condition,
                    operator="op-check", interface="web")  # a bad choice fails here, not later
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            if not (self.root / ".csrf").exists():
                (self.root / ".csrf").write_text(self.csrf, encoding="utf-8")
                (self.root / ".csrf").chmod(0o600)
            sid = f"{_SID}{secrets.token_hex(5)}"
            (self.root / sid).mkdir()
            record: dict[str, Any] = {
                "sid": sid, "seat": seat, "persona_id": persona_id, "scenario": scenario,
                "condition": condition, "operator": operator or new_operator(),
                "created_at": _now(), "lines": [], "ended": None, "finished": None}
            if fork is not None:  # the person's own turns before the fork are theirs already
                record["prefix"] = fork["prefix"]
                record["forked_from"] = fork["forked_from"]
                record["lines"] = [{"turn": i, "text": text, "typing_ms": None, "edits": None,
                                    "pasted_chars": None, "at": None, "prefix": True}
                                   for i, speaker, text in fork["prefix"] if speaker == seat]
            session = WebSession(self, sid, record)
            session.save()
            self.sessions[sid] = session
        session.ensure_running()
        return session

    def get(self, sid: str) -> WebSession:
        session = self.sessions.get(sid)
        if session is None:
            raise NotFound(f"No play session {sid!r}.")
        return session

    def close(self) -> None:
        self.closing = True
        for s in self.sessions.values():
            with s.cond:
                s.cond.notify_all()
        for s in self.sessions.values():
            if s.thread is not None:
                s.thread.join(timeout=5)


class _Forbidden(Exception):
    pass


def _persona_choices(viewer: ViewerState) -> list[dict[str, str]]:
    run = viewer.index.snapshot().run
    if not run.has("personas"):
        return []
    cards = cards_of(run.table("personas", list(ID_CARD_COLUMNS)))
    return [{"id": str(p), "card": str(c)[:160]} for p, c in cards.items()]


def add_play_routes(app: FastAPI, viewer: ViewerState) -> None:
    """Add the play pages to the viewer's app (``spasm view`` does)."""
    run = viewer.index.snapshot().run
    stored = (run.config or None)
    config = parse_config(stored, str(viewer.run_dir / "config.json")) if stored else None
    desk = Desk(viewer.run_dir, config)
    app.state.play = desk
    env = Environment(loader=ChoiceLoader([PackageLoader("spasm.play", "templates"),
                                           PackageLoader("spasm.viewer", "templates")]),
                      autoescape=True, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.globals.update(viewer.env.globals)
    viewer.env.globals["play_links"] = config is not None  # "take this seat" on dialogue pages

    def page(template: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(template).render(csrf=desk.csrf, **context),
                            status_code=status)

    previous = app.router.lifespan_context

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> Any:
        async with previous(a) as value:
            try:
                yield value
            finally:
                await anyio.to_thread.run_sync(desk.close)

    app.router.lifespan_context = lifespan

    async def body(request: Request) -> dict[str, Any]:
        desk.check_csrf(request)
        raw = await request.body()
        if len(raw) > 4 * MAX_LINE:
            raise UserError("The request is too large.")
        try:
            data = json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError("Send JSON.") from None
        if not isinstance(data, dict):
            raise UserError("Send a JSON object.")
        return data

    def _opt_str(data: dict[str, Any], key: str) -> str | None:
        v = data.get(key)
        if v in (None, ""):
            return None
        if not isinstance(v, str) or len(v) > 200:
            raise UserError(f"{key} must be a short string")
        return v

    def _opt_int(data: dict[str, Any], key: str) -> int | None:
        v = data.get(key)
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**62:
            raise UserError(f"{key} must be a non-negative integer")
        return v

    @app.exception_handler(_Forbidden)
    async def _forbidden(request: Request, exc: _Forbidden) -> Response:
        return json_response({"error": "The play page's token is missing or stale: reload the "
                                       "page."}, 403)

    @app.exception_handler(_Conflict)
    async def _conflict(request: Request, exc: _Conflict) -> Response:
        return json_response({"error": str(exc)}, 409)

    @app.get("/play")
    def play_home(request: Request) -> Response:
        cfg = desk.config_or_none
        scenarios = [s.id for s in (run_scenarios(cfg) or [])] if cfg is not None else []
        seats = (["client", "responder"] if cfg is None or cfg.participants is None
                 else [p.id for p in cfg.participants])
        sessions = sorted(desk.sessions.values(), key=lambda s: s.record["created_at"], reverse=True)
        return page("play_home.html", playable=cfg is not None, seats=seats,
                    personas=_persona_choices(viewer) if cfg is not None and cfg.participants is None
                    else [], scenarios=scenarios, conditions=cfg.conditions if cfg else [],
                    sessions=[s.record for s in sessions])

    @app.get("/play/play.js")
    def play_js() -> Response:
        js = (Path(__file__).parent / "static" / "play.js").read_bytes()
        return Response(js, media_type="text/javascript; charset=utf-8")

    @app.get("/play/play.css")
    def play_css() -> Response:
        css = (Path(__file__).parent / "static" / "play.css").read_bytes()
        return Response(css, media_type="text/css; charset=utf-8")

    @app.get("/play/{sid}")
    def play_page(sid: str) -> Response:
        session = desk.get(sid)
        return page("play.html", session=session.record)

    @app.get("/api/play/{sid}")
    def play_state(sid: str) -> Response:
        return json_response(desk.get(sid).state())

    @app.get("/play/fork/{dialogue_id}/{turn}")
    def play_fork(dialogue_id: str, turn: int) -> Response:
        fork = desk.fork_of(valid_id(dialogue_id), turn)
        return page("play_fork.html", dialogue_id=dialogue_id, turn=turn, fork=fork)

    @app.post("/api/play")
    async def play_new(request: Request) -> Response:
        data = await body(request)
        seat = _opt_str(data, "seat") or "client"
        fork = None
        if data.get("fork") is not None:
            raw = data["fork"]
            if not isinstance(raw, dict):
                raise UserError("fork: {dialogue_id, turn}")
            did, turn = _opt_str(raw, "dialogue_id"), _opt_int(raw, "turn")
            if did is None or turn is None:
                raise UserError("fork: {dialogue_id, turn}")
            fork = await anyio.to_thread.run_sync(desk.fork_of, valid_id(did), turn)
        session = await anyio.to_thread.run_sync(
            lambda: desk.new(seat, _opt_str(data, "persona"), _opt_str(data, "scenario"),
                             _opt_str(data, "condition"), _opt_str(data, "operator"), fork))
        return json_response({"sid": session.sid, "url": f"/play/{session.sid}"}, 201)

    @app.post("/api/play/{sid}/say")
    async def play_say(request: Request, sid: str) -> Response:
        data = await body(request)
        session = desk.get(sid)
        text = data.get("text")
        if not isinstance(text, str) or not text.strip():
            raise UserError("Type a message first.")
        if len(text) > MAX_LINE:
            raise UserError(f"A message holds at most {MAX_LINE:,} characters.")
        turn = _opt_int(data, "turn")
        if turn is None:
            raise UserError("turn: the turn the page was answering")
        session.say(turn, text.strip(), _opt_int(data, "typing_ms"), _opt_int(data, "edits"),
                    _opt_int(data, "pasted_chars"))
        return json_response(session.state())

    @app.post("/api/play/{sid}/debrief")
    async def play_debrief(request: Request, sid: str) -> Response:
        data = await body(request)
        session = desk.get(sid)
        goal_met = data.get("goal_met")
        if goal_met is not None and not isinstance(goal_met, bool):
            raise UserError("goal_met: true, false or null")
        rating = _opt_int(data, "rating")
        if rating is not None and not 1 <= rating <= 5:
            raise UserError("rating: 1 to 5, or null")
        session.answer(goal_met, rating)
        return json_response(session.state())

    @app.post("/api/play/{sid}/end")
    async def play_end(request: Request, sid: str) -> Response:
        await body(request)
        session = desk.get(sid)
        session.end()
        return json_response(session.state())

"""The viewer's queries: DuckDB over the committed Parquet parts of a run.

A large run is never loaded into memory. At start (and whenever the run's committed parts
change) :class:`RunIndex` builds, in a DuckDB database file in a private temporary folder,
two tables: ``dlg`` — one row per dialogue with its persona fields, harness counts, QA kinds,
eval verdicts and off-language utterances per side (the QA scan's ``off_language`` findings and
``spasm eval``'s language compliance, whichever the run has) and a group dialogue's number of
participants, for filtering, sorting and paging
— and ``search`` — every utterance with a lower-cased copy for full-text search. DuckDB keeps
them on disk and pages them through a bounded buffer pool (``memory_limit``). The files it
reads are the ones :meth:`spasm.dataset.Run.files` lists (committed parts only); the connection
may read nothing else: ``enable_external_access`` is off with only the run and the index
folder allowed.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from spasm.dataset import DialogueView, Run, open_run
from spasm.dataset.persona_rows import PERSONA_HEAD, PERSONA_TAIL, persona_row
from spasm.dataset.rows import ROW_MODELS
from spasm.viewer.listing import ListQuery, where_clause

__all__ = ["Facets", "ListPage", "RunIndex"]

#: Seconds between two checks of whether the run's committed parts changed.
REFRESH_S = 2.0
MEMORY_LIMIT = "128MB"
EVAL_PER_DIALOGUE = Path("eval") / "per_dialogue.parquet"
#: The tables the index reads (``participants``: group runs only; ``events`` and ``worlds``:
#: runs with tools only).
_TABLES = ("dialogues", "turns", "personas", "qa", "participants", "events", "worlds")
_FIXED_PERSONA = set(PERSONA_HEAD) | set(PERSONA_TAIL)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Facets:
    """The values each filter of the dialogue list can take (computed once per index)."""

    pairings: list[str]
    conditions: list[str]
    levels: list[str]
    reasons: list[str]
    statuses: list[str]
    qa_kinds: list[str]
    #: persona field -> its values (fields with at most 200 distinct values)
    persona: dict[str, list[str]]
    #: integer persona field -> (min, max)
    persona_ranges: dict[str, tuple[int, int]]
    has_eval: bool
    has_qa: bool
    has_harness: bool
    #: the run has language flags (a QA scan, or ``spasm eval``'s language compliance)
    has_language: bool = False
    #: the run has group dialogues (a participants table)
    has_group: bool = False


@dataclass(frozen=True)
class ListPage:
    """One page of the dialogue list."""

    rows: list[dict[str, Any]]
    total: int
    page: int
    pages: int


@dataclass
class _Snapshot:
    run: Run
    files: dict[str, list[str]]
    con: duckdb.DuckDBPyConnection
    facets: Facets
    persona_fields: list[str]
    fingerprint: tuple[Any, ...]
    checked: float = field(default_factory=time.monotonic)


def _fingerprint(run: Run) -> tuple[Any, ...]:
    parts: list[Any] = []
    for table in _TABLES:
        for f in run.files(table):
            try:
                parts.append((str(f), f.stat().st_mtime_ns))
            except FileNotFoundError:
                parts.append((str(f), None))
    eval_file = run.dir / EVAL_PER_DIALOGUE
    parts.append(eval_file.stat().st_mtime_ns if eval_file.is_file() else None)
    return tuple(parts)


def _columns(con: duckdb.DuckDBPyConnection, files: list[str]) -> set[str]:
    if not files:
        return set()
    rows = con.execute("DESCRIBE SELECT * FROM read_parquet($f, union_by_name=true)", {"f": files})
    return {str(r[0]) for r in rows.fetchall()}


class RunIndex:
    """The queries of one run directory (thread-safe: one DuckDB cursor per call)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir).resolve()
        open_run(self.run_dir, verify=False)  # a missing directory is a UserError now
        self._work = Path(tempfile.mkdtemp(prefix="spasm-view-"))
        self._lock = threading.Lock()
        self._generation = 0
        self._snap: _Snapshot | None = None
        try:
            self.snapshot()
        except BaseException:  # a run the index cannot read leaves no folder behind
            self.close()
            raise

    def close(self) -> None:
        """Close the database and delete the index folder."""
        with self._lock:
            if self._snap is not None:
                self._snap.con.close()
                self._snap = None
        shutil.rmtree(self._work, ignore_errors=True)

    # -- building -------------------------------------------------------------------------
    def snapshot(self, force: bool = False) -> _Snapshot:
        """The current index, rebuilt first when the run's committed parts have changed."""
        snap = self._snap
        if snap is not None and not force and time.monotonic() - snap.checked < REFRESH_S:
            return snap
        with self._lock:
            snap = self._snap
            run = open_run(self.run_dir, verify=False)
            fingerprint = _fingerprint(run)
            if snap is not None and not force and snap.fingerprint == fingerprint:
                snap.checked = time.monotonic()
                return snap
            # Checksums are verified when the parts changed, not on every look.
            run = open_run(self.run_dir, verify=True)
            self._generation += 1
            fresh = self._build(run, _fingerprint(run))
            self._snap = fresh
            # The old connection is left to the garbage collector: a request may still use it.
            return fresh

    def _connect(self) -> duckdb.DuckDBPyConnection:
        path = self._work / f"index-{self._generation}.duckdb"
        con = duckdb.connect(str(path), config={
            "threads": 2, "memory_limit": MEMORY_LIMIT, "temp_directory": str(self._work / "spill"),
            "autoinstall_known_extensions": False, "autoload_known_extensions": False,
        })
        allowed = [str(self.run_dir) + "/", str(self._work) + "/"]
        con.execute(f"SET allowed_directories = {allowed!r}")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        return con

    def _build(self, run: Run, fingerprint: tuple[Any, ...]) -> _Snapshot:
        files = {t: [str(f) for f in run.files(t)] for t in _TABLES}
        con = self._connect()
        cols = {t: _columns(con, f) for t, f in files.items()}
        persona_fields = sorted(c for c in cols["personas"] - _FIXED_PERSONA if c.isidentifier())
        eval_file = self.run_dir / EVAL_PER_DIALOGUE
        eval_cols = _columns(con, [str(eval_file)]) if eval_file.is_file() else set()
        has_eval = {"dialogue_id", "echoing", "echo_who", "echo_score"} <= eval_cols
        eval_language = has_eval and set(_OFF_LANGUAGE) <= eval_cols
        con.execute(*_dlg_sql(files, cols, persona_fields, eval_file if has_eval else None,
                              eval_language=eval_language))
        # The lower-cased copy stays uncompressed: substring search over it is twice as fast.
        con.execute("CREATE TABLE search (dialogue_id VARCHAR, turn_index INTEGER, text VARCHAR, "
                    "t VARCHAR USING COMPRESSION uncompressed)")
        if files["turns"]:
            con.execute("INSERT INTO search SELECT dialogue_id, turn_index, text, lower(text) "
                        "FROM read_parquet($t, union_by_name=true)", {"t": files["turns"]})
        facets = _facets(con, persona_fields, cols, has_eval)
        return _Snapshot(run, files, con, facets, persona_fields, fingerprint)

    # -- the list ---------------------------------------------------------------------------
    def facets(self) -> Facets:
        """The filter values of the current index."""
        return self.snapshot().facets

    def _cursor(self, snap: _Snapshot, annotations: pa.Table | None) -> duckdb.DuckDBPyConnection:
        cur = snap.con.cursor()
        empty = pa.table({"dialogue_id": pa.array([], pa.string()),
                          "n_annotators": pa.array([], pa.int64()), "mine": pa.array([], pa.bool_())})
        cur.register("ann", annotations if annotations is not None else empty)
        return cur

    def list_page(self, query: ListQuery, annotations: pa.Table | None = None) -> ListPage:
        """One page of the dialogues that match ``query``, sorted as it asks."""
        snap = self.snapshot()
        where, params = where_clause(query, set(snap.persona_fields))
        source, extra = "dlg", "NULL::BIGINT AS n_hits, NULL::INTEGER AS first_turn, NULL::VARCHAR AS snippet"
        if query.q:
            params["q"] = query.q.lower()
            source = ("dlg JOIN (SELECT dialogue_id, count(*) AS n_hits, min(turn_index) AS first_turn "
                      "FROM search WHERE contains(t, $q) GROUP BY dialogue_id) h USING (dialogue_id)")
            extra = "h.n_hits, h.first_turn, NULL::VARCHAR AS snippet"
        params.update(limit=query.per_page, offset=(query.page - 1) * query.per_page)
        sql = (f"SELECT dlg.*, {extra}, count(*) OVER () AS total FROM {source} WHERE {where} "
               f"ORDER BY {query.order_by()} LIMIT $limit OFFSET $offset")
        cur = self._cursor(snap, annotations)
        result = cur.execute(sql, params)
        names = [d[0] for d in result.description]
        rows = [dict(zip(names, r, strict=True)) for r in result.fetchall()]
        total = int(rows[0]["total"]) if rows else self._count(cur, query, snap)
        if query.q and rows:
            # The text of each row's first hit, read for this page only (not for every hit).
            keys = {(r["dialogue_id"], r["first_turn"]) for r in rows}
            found = cur.execute("SELECT dialogue_id, turn_index, text FROM search WHERE dialogue_id IN "
                                "(SELECT unnest($ids))", {"ids": sorted({k[0] for k in keys})}).fetchall()
            texts = {(d, t): text for d, t, text in found if (d, t) in keys}
            for r in rows:
                r["snippet"] = texts.get((r["dialogue_id"], r["first_turn"]))
        pages = max(1, -(-total // query.per_page))
        return ListPage(rows, total, query.page, pages)

    def _count(self, cur: duckdb.DuckDBPyConnection, query: ListQuery, snap: _Snapshot) -> int:
        where, params = where_clause(query, set(snap.persona_fields))
        if query.q:
            params["q"] = query.q.lower()
            where += " AND dialogue_id IN (SELECT dialogue_id FROM search WHERE contains(t, $q))"
        row = cur.execute(f"SELECT count(*) FROM dlg WHERE {where}", params).fetchone()
        return int(row[0]) if row else 0

    def neighbours(
        self, query: ListQuery, dialogue_id: str, annotations: pa.Table | None = None
    ) -> tuple[str | None, str | None, int | None, int]:
        """``(previous id, next id, 1-based position, total)`` of a dialogue in a list."""
        snap = self.snapshot()
        where, params = where_clause(query, set(snap.persona_fields))
        if query.q:
            params["q"] = query.q.lower()
            where += " AND dialogue_id IN (SELECT dialogue_id FROM search WHERE contains(t, $q))"
        params["id"] = dialogue_id
        sql = (f"WITH l AS (SELECT dialogue_id, lag(dialogue_id) OVER w AS prev, "
               f"lead(dialogue_id) OVER w AS next, row_number() OVER w AS pos, count(*) OVER () AS n "
               f"FROM dlg WHERE {where} WINDOW w AS (ORDER BY {query.order_by()})) "
               f"SELECT prev, next, pos, n FROM l WHERE dialogue_id = $id")
        row = self._cursor(snap, annotations).execute(sql, params).fetchone()
        if row is None:
            return None, None, None, self._count(self._cursor(snap, annotations), query, snap)
        return row[0], row[1], int(row[2]), int(row[3])

    # -- one dialogue ----------------------------------------------------------------------
    def _select(self, snap: _Snapshot, table: str, where: str, params: dict[str, Any],
                order: str = "") -> list[dict[str, Any]]:
        files = snap.files[table]
        if not files:
            return []
        sql = f"SELECT * FROM read_parquet($files, union_by_name=true) WHERE {where} {order}"
        data = snap.con.cursor().sql(sql, params={"files": files, **params}).to_arrow_table()
        rows: list[dict[str, Any]] = data.to_pylist()
        model = ROW_MODELS.get(table)
        if model is not None:  # columns an older part lacks get their declared defaults
            defaults = {name: (None if info.is_required() else info.default)
                        for name, info in model.model_fields.items()}
            rows = [{**defaults, **row} for row in rows]
        return rows

    def dialogue(self, dialogue_id: str) -> DialogueView | None:
        """One dialogue as the dataset package's :class:`DialogueView` (``None``: unknown id).

        The rows are read with DuckDB (a filtered scan of the committed parts, fast on a large
        run), with a group dialogue's participants; what each agent saw is then rebuilt and
        verified by ``DialogueView.seen``.
        """
        snap = self.snapshot()
        rows = self._select(snap, "dialogues", "dialogue_id = $id", {"id": dialogue_id})
        if not rows:
            return None
        row = rows[0]
        turns = self._select(snap, "turns", "dialogue_id = $id", {"id": dialogue_id},
                             "ORDER BY turn_index")
        personas = self._select(snap, "personas", "persona_id = $pid", {"pid": str(row["persona_id"])})
        seats = self._select(snap, "participants", "dialogue_id = $id", {"id": dialogue_id},
                             "ORDER BY position")
        # A run with tools: the events (what each agent saw is rebuilt with them) and worlds.
        events, worlds = (self._select(snap, t, "dialogue_id = $id", {"id": dialogue_id},
                                       "ORDER BY seq") for t in ("events", "worlds"))
        return DialogueView(row, persona_row(personas[0]) if personas else None, turns, seats,
                            events, worlds)

    def counterparts(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The dialogues of the same persona, conversation index, seed and pairing (every
        condition and harness level), ECP first, then by level."""
        snap = self.snapshot()
        sql = ("SELECT dialogue_id, condition, harness_level, n_utterances, termination_reason, "
               "echoing, echo_who FROM dlg WHERE persona_id = $p AND conversation_index = $k AND "
               "seed = $s AND pairing = $pair ORDER BY harness_level, "
               "CASE condition WHEN 'ecp' THEN 0 WHEN 'concat' THEN 1 ELSE 2 END, condition")
        result = snap.con.cursor().execute(sql, {"p": row["persona_id"], "k": row["conversation_index"],
                                                 "s": row["seed"], "pair": row["pairing"]})
        names = [d[0] for d in result.description]
        return [dict(zip(names, r, strict=True)) for r in result.fetchall()]

    def eval_row(self, dialogue_id: str) -> dict[str, Any] | None:
        """The dialogue's row of eval/per_dialogue.parquet, when ``spasm eval`` has run."""
        if not self.facets().has_eval:
            return None
        path = str(self.run_dir / EVAL_PER_DIALOGUE)
        data = self.snapshot().con.cursor().sql(
            "SELECT * FROM read_parquet($f) WHERE dialogue_id = $id",
            params={"f": path, "id": dialogue_id}).to_arrow_table()
        rows = data.to_pylist()
        return rows[0] if rows else None

    # -- the overview ------------------------------------------------------------------------
    def overview(self) -> dict[str, Any]:
        """Counts for the overview page."""
        snap = self.snapshot()
        cur = snap.con.cursor()

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return cur.execute(sql).fetchall()

        total = rows("SELECT count(*), count(DISTINCT persona_id), coalesce(sum(prompt_tokens), 0), "
                     "coalesce(sum(completion_tokens), 0), coalesce(sum(n_utterances), 0) FROM dlg")[0]
        return {
            "dialogues": total[0], "personas": total[1], "prompt_tokens": total[2],
            "completion_tokens": total[3], "utterances": total[4],
            "pairings": rows("SELECT pairing, client_model, responder_model, count(*) FROM dlg "
                             "GROUP BY ALL ORDER BY 1, 2, 3"),
            "conditions": rows("SELECT condition, harness_level, count(*), avg(n_utterances) FROM dlg "
                               "GROUP BY ALL ORDER BY 2, 1"),
            "reasons": rows("SELECT termination_reason, count(*) FROM dlg GROUP BY 1 ORDER BY 2 DESC"),
            "statuses": rows("SELECT status, count(*) FROM dlg GROUP BY 1 ORDER BY 2 DESC"),
        }


def _literal(value: Any) -> str:
    """A default value as an SQL literal (the row models' defaults: None, bool, int, str)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


_EMPTY_DLG = ("CREATE TABLE dlg (dialogue_id VARCHAR, persona_id VARCHAR, conversation_index INTEGER, "
              "condition VARCHAR, harness_level VARCHAR, pairing VARCHAR, client_model VARCHAR, "
              "responder_model VARCHAR, seed BIGINT, n_utterances INTEGER, termination_reason VARCHAR, "
              "status VARCHAR, prompt_tokens BIGINT, completion_tokens BIGINT, tokens BIGINT, "
              "n_flagged BIGINT, n_clips BIGINT, n_state BIGINT, qa_kinds VARCHAR[], echoing BOOLEAN, "
              "echo_who VARCHAR, echo_score DOUBLE, off_language_client BIGINT, "
              "off_language_responder BIGINT, n_participants BIGINT)")
#: The per-side counts of off-language utterances (``spasm eval``'s per_dialogue columns too).
_OFF_LANGUAGE = ("off_language_client", "off_language_responder")
_BASE = ("dialogue_id", "persona_id", "conversation_index", "condition", "harness_level", "pairing",
         "client_model", "responder_model", "seed", "n_utterances", "termination_reason", "status",
         "prompt_tokens", "completion_tokens")


def _dlg_sql(files: Mapping[str, list[str]], cols: Mapping[str, set[str]], persona_fields: Sequence[str],
             eval_file: Path | None, *, eval_language: bool = False) -> tuple[str, dict[str, Any]]:
    """The statement (and its parameters) that builds the ``dlg`` table; columns an older part
    lacks get the row model's declared default."""
    if not files["dialogues"]:
        return _EMPTY_DLG, {}
    model = ROW_MODELS["dialogues"].model_fields

    def d(name: str) -> str:
        if name in cols["dialogues"]:
            return f"d.{_ident(name)}"
        info = model.get(name)
        return _literal(None if info is None or info.is_required() else info.default)

    select = [f"{d(c)} AS {_ident(c)}" for c in _BASE]
    select.append(f"coalesce({d('prompt_tokens')}, 0) + coalesce({d('completion_tokens')}, 0) AS tokens")
    params: dict[str, Any] = {"d": files["dialogues"]}
    joins = []
    if files["personas"] and "persona_id" in cols["personas"]:
        select += [f"p.{_ident(f)} AS {_ident('p_' + f)}" for f in persona_fields]
        fields = "".join(", " + _ident(f) for f in persona_fields)
        joins.append(f"LEFT JOIN (SELECT DISTINCT ON (persona_id) persona_id{fields} "
                     "FROM read_parquet($p, union_by_name=true)) p USING (persona_id)")
        params["p"] = files["personas"]
    if files["turns"]:
        turn_cols = cols["turns"]
        flagged = "sum(CASE WHEN flagged THEN 1 ELSE 0 END)" if "flagged" in turn_cols else "0"
        clips = "sum(coalesce(state_clips, 0))" if "state_clips" in turn_cols else "0"
        states = "count(state)" if "state" in turn_cols else "0"
        joins.append(f"LEFT JOIN (SELECT dialogue_id, {flagged} AS n_flagged, {clips} AS n_clips, "
                     f"{states} AS n_state FROM read_parquet($t, union_by_name=true) GROUP BY 1) tu "
                     "USING (dialogue_id)")
        params["t"] = files["turns"]
        select += ["coalesce(tu.n_flagged, 0) AS n_flagged", "coalesce(tu.n_clips, 0) AS n_clips",
                   "coalesce(tu.n_state, 0) AS n_state"]
    else:
        select += ["0 AS n_flagged", "0 AS n_clips", "0 AS n_state"]
    qa_language = bool(files["qa"] and files["turns"] and {"dialogue_id", "kind", "turn_index"} <= cols["qa"])
    if qa_language:  # the scan's findings by the side that spoke
        joins.append("LEFT JOIN (SELECT q.dialogue_id, "
                     "sum(CASE WHEN t.speaker = 'client' THEN 1 ELSE 0 END) AS client, "
                     "sum(CASE WHEN t.speaker = 'responder' THEN 1 ELSE 0 END) AS responder "
                     "FROM read_parquet($q, union_by_name=true) q "
                     "JOIN read_parquet($t, union_by_name=true) t "
                     "USING (dialogue_id, turn_index) WHERE q.kind = 'off_language' GROUP BY 1) ql "
                     "USING (dialogue_id)")
    if files["qa"] and {"dialogue_id", "kind"} <= cols["qa"]:
        joins.append("LEFT JOIN (SELECT dialogue_id, list(DISTINCT kind ORDER BY kind) AS kinds "
                     "FROM read_parquet($q, union_by_name=true) GROUP BY 1) qa USING (dialogue_id)")
        params["q"] = files["qa"]
        select.append("coalesce(qa.kinds, []::VARCHAR[]) AS qa_kinds")
    else:
        select.append("[]::VARCHAR[] AS qa_kinds")
    if eval_file is not None:
        lang = "".join(", " + c for c in _OFF_LANGUAGE) if eval_language else ""
        joins.append(f"LEFT JOIN (SELECT dialogue_id, echoing, echo_who, echo_score{lang} "
                     "FROM read_parquet($e)) ev USING (dialogue_id)")
        params["e"] = str(eval_file)
        select += ["ev.echoing", "ev.echo_who", "ev.echo_score"]
    else:
        select += ["NULL::BOOLEAN AS echoing", "NULL::VARCHAR AS echo_who", "NULL::DOUBLE AS echo_score"]
    for side, column in zip(("client", "responder"), _OFF_LANGUAGE, strict=True):
        sources = ([f"coalesce(ql.{side}, 0)"] if qa_language else []) + (
            [f"coalesce(ev.{column}, 0)"] if eval_language else [])
        value = f"greatest({', '.join(sources)})" if sources else "NULL"
        select.append(f"{value}::BIGINT AS {column}")
    if files.get("participants") and "dialogue_id" in cols.get("participants", set()):
        joins.append("LEFT JOIN (SELECT dialogue_id, count(*) AS n FROM read_parquet($s, "
                     "union_by_name=true) GROUP BY 1) seats USING (dialogue_id)")
        params["s"] = files["participants"]
        select.append("seats.n AS n_participants")  # null: a two-party dialogue
    else:
        select.append("NULL::BIGINT AS n_participants")
    sql = (f"CREATE TABLE dlg AS SELECT {', '.join(select)} FROM read_parquet($d, union_by_name=true) d "
           + " ".join(joins))
    return sql, params


def _facets(con: duckdb.DuckDBPyConnection, persona_fields: list[str], cols: Mapping[str, set[str]],
            has_eval: bool) -> Facets:
    def distinct(column: str) -> list[str]:
        got = con.execute(f"SELECT DISTINCT {column} FROM dlg WHERE {column} IS NOT NULL ORDER BY 1")
        return [str(r[0]) for r in got.fetchall()]

    persona: dict[str, list[str]] = {}
    ranges: dict[str, tuple[int, int]] = {}
    types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                             "WHERE table_name = 'dlg'").fetchall())
    for f in persona_fields:
        col = _ident("p_" + f)
        if col.strip('"') not in types:
            continue
        if str(types[col.strip('"')]).upper() in ("BIGINT", "INTEGER", "SMALLINT", "TINYINT"):
            lo_hi = con.execute(f"SELECT min({col}), max({col}) FROM dlg").fetchone()
            if lo_hi and lo_hi[0] is not None:
                ranges[f] = (int(lo_hi[0]), int(lo_hi[1]))
            continue
        n = con.execute(f"SELECT count(DISTINCT {col}) FROM dlg").fetchone()
        if n and 0 < int(n[0]) <= 200:
            persona[f] = distinct(col)
    kinds = con.execute("SELECT DISTINCT unnest(qa_kinds) FROM dlg ORDER BY 1").fetchall()
    harness = con.execute("SELECT count(*) FROM dlg WHERE n_state > 0 OR harness_level <> 'A'").fetchone()
    language = con.execute("SELECT count(off_language_client) FROM dlg").fetchone()
    return Facets(
        pairings=distinct("pairing"), conditions=distinct("condition"), levels=distinct("harness_level"),
        reasons=distinct("termination_reason"), statuses=distinct("status"),
        qa_kinds=[str(k[0]) for k in kinds], persona=persona, persona_ranges=ranges, has_eval=has_eval,
        has_qa=bool(cols["qa"]), has_harness=bool(harness and harness[0]),
        has_language=bool(language and language[0]),
        has_group=bool(cols.get("participants")),
    )

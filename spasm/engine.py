"""The run engine (docs/engine.md): plans the dialogues, runs many at once, streams results to disk.

Parallelism is across dialogues (a dialogue is a sequential chain of calls); each backend's
limits live in :mod:`spasm.calls`. Completed dialogues are flushed in batches of
``engine.flush_every``, so memory stays flat however large the run. A rerun of the same command
(or ``--resume``) skips every committed dialogue and replays cached calls for the rest.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from tqdm import tqdm

from spasm.acting import check_tools
from spasm.backends import Backend
from spasm.calls import Cache, Caller, CallScope
from spasm.config import RunConfig, config_differences
from spasm.dataset.files import atomic_write_json as write_json
from spasm.dataset.lock import RunLock
from spasm.dataset.outputs import aside_path, check_output, finish_replacement
from spasm.dataset.persona_rows import persona_of, persona_record
from spasm.dataset.store import RunStore
from spasm.errors import (
    BudgetExceededError,
    EndpointRefusedError,
    StructuredOutputRejectedError,
    UserError,
    disk_full,
)
from spasm.estimate import DryRun, calibrate, estimate, scripted_caller, stored_persona_calls
from spasm.finish import complete_run
from spasm.people import has_people
from spasm.persona_stage import PersonaSet, PolicyCompiler, build_personas, build_source_personas
from spasm.personas import load_schema
from spasm.personas.persona import Persona
from spasm.personas.sources import SourceCandidate, SourcePersonas, load_source
from spasm.plugins import load_plugins
from spasm.resume import ResumeCheck, schema_digest
from spasm.run_summary import RunSummary, manifest_record, pacing_note, progress_lines
from spasm.runner import DialogueResult, PlannedDialogue, run_dialogue
from spasm.runplan import Shard, make_backends, plan
from spasm.scenarios import (
    SCENARIO_COLUMN,
    own_scenario,
    run_scenarios,
)

__all__ = ["TABLES", "Engine", "RunSummary", "config_differences", "make_backends", "plan"]

log = logging.getLogger("spasm")

#: Finished dialogues wait at most this long for their batch to fill before they are committed.
FLUSH_AFTER_S = 10.0

#: The tables every finished run has (possibly empty).
TABLES = ("personas", "persona_rejections", "dialogues", "turns", "calls", "errors")
#: And in a group run (``participants:``), who took part in each dialogue.
GROUP_TABLES = (*TABLES, "participants")
#: And in a run with tools (``tools:``), each dialogue's events and world states.
TOOL_TABLES = ("events", "worlds")


def _prune_resolved_errors(store: RunStore) -> None:
    """Drop quarantine rows of dialogues that a later pass completed: the errors table of a
    finished run lists what is still failed, not every retry on the way."""
    errors = store.read("errors")
    if errors is None or errors.num_rows == 0:
        return
    done = store.done_dialogue_ids()
    kept = [r for r in errors.to_pylist() if r["dialogue_id"] not in done]
    if len(kept) < errors.num_rows:
        store.replace_table("errors", kept)


def _has_dialogues(run_dir: Path) -> bool:
    """Whether a run holds a committed dialogue: a replacement counts from its first one."""
    from spasm.dataset.reader import open_run

    run = open_run(run_dir, verify=False)
    return run.has("dialogues") and run.table("dialogues", ["dialogue_id"]).num_rows > 0


class Engine:
    """Runs one config into one run directory."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        *,
        overwrite: bool = False,
        progress: bool | None = None,
        backends: dict[str, Backend] | None = None,
        simulate: Callable[..., Any] = run_dialogue,
        sleep_scale: float = 1.0,
        shard: Shard | None = None,
    ) -> None:
        load_plugins()  # once per process: the backends, detectors ... a config may name
        self.config = config
        self.run_dir = Path(run_dir)
        self.overwrite = overwrite
        self.progress = progress
        self._backends = backends
        self._simulate = simulate
        self.sleep_scale = sleep_scale
        self.store = RunStore(self.run_dir)
        if config.scenarios is not None:  # its dialogues table has the scenario columns
            self.store.declare_scenarios()
        if config.tools:  # its dialogues table has the reward columns (after the scenario's)
            self.store.declare_tools()
        if config.participants is not None:  # its turns have the group columns
            self.store.declare_group()
        if config.trials > 1:  # its dialogues table has the trial column, last
            self.store.declare_trials()
        if has_people(config):  # a seat a person takes: the human-seat columns (1.10)
            self.store.declare_humans()
        #: The tables this run has when it is finished.
        self.tables = (*(GROUP_TABLES if config.participants is not None else TABLES),
                       *(TOOL_TABLES if config.tools else ()))
        self._started = ""
        #: Digest of the persona schema the run's personas were drawn from (config.json).
        self._persona_schema: str | None = None
        #: ``--shard I/N``: only its personas' dialogues; recorded in the manifest.
        self.shard = shard
        self._shard_record = shard.record() if shard is not None else None
        #: What the manifest records of the run's scenarios (:func:`scenarios_record`); set
        #: when the run directory is checked, ``None`` in a run without scenarios or one
        #: whose manifest has no such record (an older run).
        self._scenarios: dict[str, Any] | None = None
        #: A run with tools: what the manifest records of its tools and worlds
        #: (:func:`spasm.acting.tools_record`), checked on a resume.
        self._tools: dict[str, Any] | None = None
        #: The same for the rows of ``personas.source`` (``None``: no source, or a run
        #: whose manifest has no such record), and the file as read for it.
        self._personas_source: dict[str, Any] | None = None
        self._loaded_source: SourcePersonas | None = None

    # -- set-up ----------------------------------------------------------------------------
    def _check_run_dir(self) -> bool:
        """Decide what to do with an existing ``--out`` (:class:`spasm.resume.ResumeCheck`):
        ``True`` when it must be replaced; keeps what the checks found for the manifest."""
        check = ResumeCheck(self.config, self.run_dir, self.store, self.shard,
                            overwrite=self.overwrite)
        replace = check.check()
        self._shard_record = check.shard_record
        self._persona_schema = check.persona_schema
        self._scenarios = check.scenarios
        self._tools = check.tools
        self._personas_source = check.personas_source
        self._loaded_source = check.loaded_source
        return replace

    def _manifest(self, summary: RunSummary, caller: Caller, status: str, started: str) -> None:
        record = manifest_record(
            summary, caller, self.config, status=status, started=started,
            shard=self._shard_record, tables=self.tables,
        )
        if self._scenarios is not None:  # checked when the run is resumed (ResumeCheck)
            record["scenarios"] = self._scenarios
        if self._tools is not None:  # and this
            record["tools"] = self._tools
        if self._personas_source is not None:  # and this
            record["personas_source"] = self._personas_source
        write_json(self.run_dir / "manifest.json", record)

    async def _personas(self, caller: Caller) -> list[Persona]:
        pc = self.config.personas
        schema = load_schema(pc.schema_file)
        self.store.set_persona_fields(schema.field_names, schema.integer_fields(),
                                      source=pc.source is not None)
        existing = self.store.read("personas")
        if existing is not None:
            return self._said_own_scenarios([persona_of(r) for r in existing.to_pylist()])
        result = await self._draw_personas(caller)
        if pc.source is not None and result.rejected:
            first = json.loads(result.rejected[0]["reasons"])[0]
            log.warning("%d row(s) of %s were rejected (see the persona_rejections table), "
                        "e.g. %s", len(result.rejected), pc.source, first)
        mine = self._own(result.accepted, caller)
        self.store.write_batch(
            "personas",
            {"persona_rejections": result.rejected, "calls": result.calls,
             "personas": [persona_record(p) for p in mine]},
        )
        return self._said_own_scenarios(mine)

    def _said_own_scenarios(self, personas: list[Persona]) -> list[Persona]:
        """Say so when personas name their own scenario in a run that has none (the column
        then changes nothing); a run with scenarios runs each the one it names (runplan)."""
        if self.config.scenarios is None:
            own = sum(1 for p in personas if own_scenario(p) is not None)
            if own:
                log.warning("%d of the personas of %s name a scenario (column %r), but the run "
                            "has no scenarios (scenarios: in the config), so every persona runs "
                            "without one.", own, self.config.personas.source or self.run_dir,
                            SCENARIO_COLUMN)
        return personas

    def _own(self, personas: list[Persona], caller: Caller) -> list[Persona]:
        """A shard keeps its own personas; its manifest records the whole set's digest before
        they are stored, so a merge can check that the shards drew the same set."""
        if self.shard is None:
            return personas
        self._shard_record = self.shard.record(personas)
        self._manifest(RunSummary(self.run_dir), caller, "running", self._started)
        if self.config.participants is not None:
            # A group shard takes every N-th group dialogue, whose seats draw from the whole
            # set: it keeps them all (a merge keeps each persona once).
            return personas
        return self.shard.select(personas)

    def _policy_compiler(self, caller: Caller, backend: str) -> PolicyCompiler | None:
        """The harness's one policy-extraction path, handed to the persona pipeline when a
        level uses policies (so personas need not import the harness)."""
        if not self._needs_policy():
            return None
        from spasm.harness.policy import POLICY_VERSION, client_policy

        hc, role = self.config.harness, self.config.dialogue.responder_role

        async def compile_policy(persona: Persona, scope: CallScope) -> tuple[str, str, bool]:
            policy, fell_back, _ = await client_policy(
                caller, hc.backend or backend, persona, role, scope, temperature=hc.temperature)
            return policy.to_json(), POLICY_VERSION, fell_back

        return compile_policy

    def _needs_policy(self) -> bool:
        """Compile each card into a policy once, with the persona, when a level uses it."""
        from spasm.harness.levels import layers

        h = self.config.harness
        levels = set(h.levels or [h.client, h.responder])
        levels |= {s.level for s in self.config.participants or ()}  # a group's seats
        return h.extract_policy and (h.audit or any(layers(lv).policy for lv in levels))

    def dialogues_in_flight(self, backends: dict[str, Backend]) -> int:
        if self.config.engine.max_dialogues_in_flight:
            return self.config.engine.max_dialogues_in_flight
        used = self.config.dialogue_backends
        if all(backends[b].max_concurrency == 1 for b in used):
            # One sequential model (the embedded one): interleaving dialogues on it only delays
            # every one of them to the end and breaks each agent's KV prefix; run them in turn.
            return 1
        if all(getattr(backends[b], "in_process", False) for b in used):
            return sum(backends[b].max_concurrency for b in used)  # the same, one per lane
        # Twice the request slots: a slot would otherwise idle while its dialogue is between
        # calls (building the next prompt, checking termination) and in the last partial wave.
        return max(1, 2 * sum(backends[b].max_concurrency for b in used))

    # -- the run ---------------------------------------------------------------------------
    async def run(self, *, only: set[str] | None = None) -> RunSummary:
        """Run (or resume) the whole config; returns what happened.

        ``only`` restricts this pass to some dialogue ids (a pilot); the rest stay planned.
        """
        t0 = time.perf_counter()
        # Dialogue ids are unique by construction; a plan that repeats one (a bug) stops here,
        # before any call. The full plan, with the drawn personas, is checked again in _run.
        if self.config.participants is None:  # a group plan needs the drawn personas
            for _ in plan(self.config, [Persona(id="p", index=0, card="")]):
                pass
        # A run with tools: its tools, worlds and reference actions, checked before any call.
        await check_tools(self.config, run_scenarios(self.config))
        backends = self._backends if self._backends is not None else make_backends(self.config)
        try:
            for b in backends.values():
                await b.preflight()
            if not (self.store.dir / "personas.parquet").exists():
                await self._dry_personas()  # rules that reject everything fail here, not later
            # Only now, with every input checked, touch the disk: one writer per run directory.
            with self._claimed() as aside:
                summary: RunSummary | None = None
                try:
                    summary = await self._run(backends, t0, only)
                    return summary
                finally:
                    self._settle_replaced(aside, summary)
        finally:
            for b in backends.values():
                await b.aclose()

    @contextmanager
    def _claimed(self) -> Iterator[Path | None]:
        """Hold the run directory's lock for the run; yields the run being replaced (moved
        aside), if any. A replacement that a killed process left half done is finished first
        (the old run restored, or deleted once the new one holds a dialogue). The run being
        replaced stays locked until the new directory is, so no other process takes it for a
        leftover."""
        check_output(self.run_dir, "generate", overwrite=self.overwrite)  # before any lock file
        with RunLock(self.run_dir) if self.run_dir.is_dir() else nullcontext():
            finish_replacement(self.run_dir, _has_dialogues)
        old = RunLock(self.run_dir).acquire() if self.run_dir.is_dir() else None
        aside: Path | None = None
        try:
            aside = self._move_aside() if self._check_run_dir() else None
            lock = old if old is not None and aside is None else RunLock(self.run_dir).acquire()
        except BaseException:
            if aside is not None and not self.run_dir.exists():
                os.replace(aside, self.run_dir)
            if old is not None:
                old.release()
            raise
        if old is not None and lock is not old:
            old.release()
        try:
            yield aside
        finally:
            lock.release()

    def _move_aside(self) -> Path:
        """Move the run being replaced out of the way; it is deleted only once the new run has
        completed at least one dialogue (:meth:`_settle_replaced`)."""
        aside = aside_path(self.run_dir)
        os.replace(self.run_dir, aside)
        return aside

    def _settle_replaced(self, aside: Path | None, summary: RunSummary | None) -> None:
        if aside is None:
            return
        if summary is not None and summary.completed > 0:
            shutil.rmtree(aside, ignore_errors=True)
            return
        # The new run produced nothing: put the old one back rather than lose it.
        shutil.rmtree(self.run_dir, ignore_errors=True)
        os.replace(aside, self.run_dir)
        log.warning("the new run completed no dialogue; the previous run in %s was kept",
                    self.run_dir)

    async def _run(
        self, backends: dict[str, Backend], t0: float, only: set[str] | None = None
    ) -> RunSummary:
        store = self.store
        store.create()
        store.recover()
        damaged = store.repair()
        if damaged:
            log.warning("%d damaged part(s) in %s were removed and their dialogues are redone: %s",
                        len(damaged), self.run_dir, "; ".join(str(d) for d in damaged[:3]))
        started = datetime.now(UTC).isoformat()
        write_json(
            self.run_dir / "config.json",
            {"fingerprint": self.config.fingerprint(), "config": self.config.redacted(),
             "persona_schema": self._persona_schema or schema_digest(self.config)},
        )
        ec = self.config.engine
        cache = Cache(self.run_dir / "cache.sqlite") if ec.cache else None
        caller = Caller(
            backends, dict(self.config.backends), cache=cache, max_cost=ec.max_cost,
            max_tokens=ec.max_tokens, reask_attempts=ec.reask_attempts,
            sleep_scale=self.sleep_scale,
        )
        summary = RunSummary(self.run_dir)
        self._started = started
        self._manifest(summary, caller, "running", started)
        finished = False
        planned_ids: set[str] = set()
        try:
            personas = await self._personas(caller)
            specs = list(plan(self.config, personas, self.shard))
            planned_ids = {s.dialogue_id for s in specs}
            done = store.done_dialogue_ids()
            todo = [
                s for s in specs if s.dialogue_id not in done and (only is None or s.dialogue_id in only)
            ]
            summary.planned = len(specs)
            summary.completed = len(specs) - len(todo)
            await self._execute(todo, backends, caller, summary)
            summary.failed = summary.failed or summary.bug_failure() or summary.fallback_failure()
            for warning in summary.warnings():
                log.warning(warning)
            finished = summary.stopped is None and only is None
        except (StructuredOutputRejectedError, EndpointRefusedError) as exc:
            summary.failed = str(exc)
            raise
        except OSError as exc:
            if disk_full(exc):
                summary.failed = f"no space left on the device ({exc.filename or exc})"
            raise
        finally:
            summary.elapsed_s = time.perf_counter() - t0
            summary.usage = {"total_tokens": caller.usage.total_tokens, "cost": caller.usage.cost,
                             **caller.usage.typed()}
            summary.rate_limits = caller.rate_limit_report()
            with anyio.CancelScope(shield=True):
                if planned_ids:  # what is stored, read back: never what ran
                    summary.completed = await anyio.to_thread.run_sync(
                        self._stored_count, planned_ids, summary.completed)
                if finished and summary.completed == summary.planned:
                    await anyio.to_thread.run_sync(_prune_resolved_errors, store)
                    await anyio.to_thread.run_sync(
                        complete_run, store, self.run_dir, self.tables, self.config.harness)
                    status = "failed" if summary.failed else "complete"
                else:
                    status = (
                        "failed" if summary.failed else "stopped" if summary.stopped else "incomplete"
                    )
                try:
                    self._manifest(summary, caller, status, started)
                except OSError as exc:
                    if not (disk_full(exc) and summary.failed):
                        raise
                    # the disk is still full: the error being raised says so, with its file
            if cache is not None:
                cache.close()
        return summary

    def _stored_count(self, planned_ids: set[str], fallback: int) -> int:
        """How many planned dialogues the run's dialogues table holds (``fallback`` when it
        cannot be read: the disk failing is reported by the error already raised)."""
        try:
            return len(planned_ids & self.store.done_dialogue_ids())
        except Exception:  # pyarrow and the OS raise many types; the count is only a report
            return fallback

    async def _execute(
        self,
        todo: list[PlannedDialogue],
        backends: dict[str, Backend],
        caller: Caller,
        summary: RunSummary,
    ) -> None:
        workers = min(self.dialogues_in_flight(backends), max(1, len(todo)))
        await _Scheduler(self, caller, summary).run(todo, workers)

    # -- dry run ---------------------------------------------------------------------------
    async def dry_run(self, pilot: int = 0) -> DryRun:
        """Estimate calls, tokens and cost per pairing, condition and harness level by
        simulating the planned dialogues through the run's own code with scripted backends
        (:mod:`spasm.estimate`).

        With ``pilot > 0``, first run that many planned dialogues for real (kept in the run, so
        nothing is wasted) and calibrate on them; finished dialogues of an earlier pass are used
        too. With neither, the estimate is an upper bound and nothing is written.
        """
        await check_tools(self.config, run_scenarios(self.config))  # a run with tools
        if pilot > 0:
            personas = (await self._dry_personas()).accepted
            specs = list(plan(self.config, personas, self.shard))
            step = max(1, len(specs) // pilot)
            chosen = {s.dialogue_id for s in specs[::step][:pilot]}
            await self.run(only=chosen)
        stored = self.store.dir.exists() and self.store.read("personas") is not None
        # Stored personas were paid for: their calls are read back. Otherwise the persona
        # pipeline runs against the scripted backends too, so its calls are priced.
        personas_set = await self._dry_personas(None if stored else scripted_caller(self.config))
        specs = list(plan(self.config, personas_set.accepted, self.shard))
        calibration = await calibrate(self.store, self.config, specs) if stored else None
        return await estimate(
            self.config, specs, calibration,
            persona_calls=stored_persona_calls(self.store) if stored else personas_set.calls,
            persona_calls_measured=stored,
        )

    async def _dry_personas(self, caller: Caller | None = None) -> PersonaSet:
        """The run's personas: the stored ones, else drawn again. Without ``caller`` no model
        is called (template cards, rules only); with the dry run's scripted caller they go
        through the same LLM steps as in :meth:`_personas`, so those calls are counted."""
        existing = self.store.read("personas") if self.store.dir.exists() else None
        if existing is not None:
            return PersonaSet(accepted=[persona_of(r) for r in existing.to_pylist()])
        return await self._draw_personas(caller)

    async def _draw_personas(self, caller: Caller | None) -> PersonaSet:
        """Sample, validate and craft the run's personas: the one set of pipeline settings,
        for the run (its caller), the dry run (a scripted caller) and start-up checks (none:
        rules and template cards only, no model call)."""
        pc = self.config.personas
        if pc.source is not None:
            return await self._source_personas(caller)
        assert pc.n is not None  # sampled personas always have a count (PersonaConfig)
        self._check_plan_size()
        schema = load_schema(pc.schema_file)
        # A bar once drawing is slow enough to look stuck (900,000 personas: a minute or more);
        # by default only on a terminal and for large sets.
        auto = None if pc.n >= 10_000 else True
        bar = tqdm(total=pc.n, unit="persona", desc="drawing personas", leave=False,
                   disable={True: False, False: True, None: auto}[self.progress], dynamic_ncols=True)

        def progress(accepted: int) -> None:
            bar.update(accepted - bar.n)

        try:
            if caller is None:
                return await build_personas(schema, pc.n, self.config.seed,
                                            max_draws_per_persona=pc.max_draws_per_persona,
                                            on_progress=progress)
            backend = pc.backend or self.config.helper_backend
            temps = self.config.backends[backend].temperatures
            return await build_personas(
                schema, pc.n, self.config.seed, caller=caller, backend=backend,
                llm_validate=pc.llm_validate, llm_craft=pc.llm_craft,
                validator_temperature=temps.validator, crafter_temperature=temps.crafter,
                max_draws_per_persona=pc.max_draws_per_persona,
                compile_policy=self._policy_compiler(caller, backend), on_progress=progress,
            )
        finally:
            bar.close()

    async def _source_personas(self, caller: Caller | None) -> PersonaSet:
        """The personas of ``personas.source``: its rows read and checked (no model), ``n`` of
        them drawn with the run's seed (or all), then, with a caller, the drift dimensions a
        free-text row lacks extracted through it (the dry run's scripted caller counts them)."""
        pc, cfg = self.config.personas, self.config
        assert pc.source is not None
        schema = load_schema(pc.schema_file)
        source = self._loaded_source  # read by _check_run_dir for the manifest's record
        if source is None:
            source = await anyio.to_thread.run_sync(load_source, pc.source, schema, pc.field_map)
        chosen = source.sample(pc.n, cfg.seed)
        self._check_plan_size(chosen)
        backend = pc.backend or cfg.helper_backend
        return await build_source_personas(
            schema, source, chosen, cfg.seed, caller=caller, backend=backend,
            temperature=cfg.backends[backend].temperatures.validator,
            responder_role=cfg.dialogue.responder_role,
            compile_policy=self._policy_compiler(caller, backend) if caller is not None else None,
        )

    def _check_plan_size(self, chosen: list[SourceCandidate] | None = None) -> None:
        """The config's plan-size check with what only reading the files tells: the rows of
        ``personas.source`` (``chosen``) and the scenarios of a scenario file (a data file's
        persona with its own scenario runs that one only)."""
        cfg = self.config
        scenarios = run_scenarios(cfg)
        count = None if scenarios is None else len(scenarios)
        personas = None if chosen is None else len(chosen)
        read = [f"{personas:,} personas from {cfg.personas.source}"] if chosen is not None else []
        if isinstance(cfg.scenarios, str):
            read.append(f"{count:,} scenarios in {cfg.scenarios}")
        own = sum(1 for c in chosen or [] if own_scenario(
            Persona(id=c.source_id, index=c.index, fields=c.fields, card=c.card,
                    source_fields=c.raw)) is not None)
        if scenarios is not None and personas is not None and own and cfg.participants is None:
            # A persona with its own scenario runs that one only: count persona-scenario pairs.
            personas, count = own + (personas - own) * len(scenarios), None
            read.append(f"{own:,} of the personas name their own scenario: {personas:,} "
                        "persona-scenario pairs, counted as personas")
        problem = cfg.plan_size_problem(count, personas, f" ({'; '.join(read)})" if read else "")
        if problem is not None:
            raise UserError(problem)


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first exception of a (nested) group."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


class _Scheduler:
    """One pass's dialogues in flight: ``workers`` tasks take planned dialogues one at a time,
    their results are committed in batches (full, or after :data:`FLUSH_AFTER_S`), the bar
    and the progress lines follow, and a stop (budget, a refusing server) ends the pass with
    everything finished committed."""

    def __init__(self, engine: Engine, caller: Caller, summary: RunSummary) -> None:
        self.engine = engine
        self.caller = caller
        self.summary = summary
        self.pending: list[DialogueResult] = []
        self.write_lock = anyio.Lock()
        self.batch_no = len(list(engine.store.commits.glob("*")))
        self.last_flush = time.monotonic()
        self.bar = tqdm(
            total=summary.planned, initial=summary.completed, unit="dlg", desc="dialogues",
            disable={True: False, False: True, None: None}[engine.progress],
            dynamic_ncols=True,
        )
        # Without a terminal (a scheduler's log file) the bar is off: print a line now and then.
        self.lines = progress_lines(enabled=engine.progress is None and not sys.stderr.isatty())

    async def flush(self) -> None:
        """Commit the finished dialogues not yet committed, as one batch."""
        async with self.write_lock:
            if not self.pending:
                return
            batch = self.pending[:]
            self.pending.clear()
            self.last_flush = time.monotonic()
            self.batch_no += 1
            tables: dict[str, list[Any]] = {
                "turns": [t for r in batch for t in r.turns],
                "calls": [c for r in batch for c in r.calls],
                "errors": [r.error for r in batch if r.error is not None],
                "dialogues": [r.dialogue for r in batch if r.dialogue is not None],
            }
            participants = [p for r in batch for p in r.participants]
            if participants:  # group runs only: other runs have no such table
                tables["participants"] = participants
            if self.engine.config.tools:  # runs with tools only: the others have no such tables
                tables["events"] = [e for r in batch for e in r.events]
                tables["worlds"] = [w for r in batch for w in r.worlds]
            name = f"{self.batch_no:06d}-{datetime.now(UTC).strftime('%H%M%S%f')}"
            engine = self.engine
            await anyio.to_thread.run_sync(engine.store.write_batch, name, tables)
            engine._manifest(self.summary, self.caller, "running", engine._started)  # live

    async def _produce(self, send: Any, todo: list[PlannedDialogue]) -> None:
        async with send:
            for spec in todo:
                try:
                    await send.send(spec)
                except anyio.BrokenResourceError:
                    return  # every worker has stopped (a budget stop): nothing takes more

    async def _work(self, specs: Any) -> None:
        engine, caller, summary = self.engine, self.caller, self.summary
        async with specs:
            async for spec in specs:
                result: DialogueResult = await engine._simulate(spec, engine.config, caller)
                self.pending.append(result)
                if summary.add(result):
                    self.bar.update(1)
                self.lines.tick(summary, caller)
                stop = caller.stop_reason  # a server refusing the format or every call
                if stop is not None:
                    summary.failed = str(stop)
                    raise stop
                paced = pacing_note(caller.rate_limit_report())
                self.bar.set_postfix(
                    tokens=f"{caller.usage.total_tokens:,}",
                    cost=f"{caller.usage.cost:.4f}",
                    errors=summary.errors,
                    **({"paced": paced} if paced else {}),
                    refresh=False,
                )
                # A full batch, or a slow run's finished dialogues after FLUSH_AFTER_S: work
                # is committed steadily even when dialogues take minutes (embedded model).
                if len(self.pending) >= engine.config.engine.flush_every or (
                        self.pending and time.monotonic() - self.last_flush >= FLUSH_AFTER_S):
                    await self.flush()

    async def run(self, todo: list[PlannedDialogue], workers: int) -> None:
        """Run ``todo`` with ``workers`` dialogues in flight; a budget stop is recorded in the
        summary, any other stop raised, and what finished is committed either way."""
        send, receive = anyio.create_memory_object_stream[PlannedDialogue](0)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._produce, send, todo)
                for _ in range(workers):
                    tg.start_soon(self._work, receive.clone())
                receive.close()
        except BudgetExceededError as exc:
            self.summary.stopped = str(exc)
        except BaseExceptionGroup as group:
            budget, rest = group.split(BudgetExceededError)
            if rest is not None:
                full, _ = rest.split(disk_full)  # the environment: the CLI's disk-full message
                if full is not None:
                    raise _first(full) from None
                raise (self.caller.stop_reason or rest) from None
            assert budget is not None
            self.summary.stopped = str(budget.exceptions[0])
        finally:
            with anyio.CancelScope(shield=True):
                await self.flush()
            self.bar.close()

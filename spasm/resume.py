"""May this directory be resumed? The checks a run directory passes before ``spasm generate``
carries on in it (docs/engine.md, "Crash safety and resume"), and what they leave for the
manifest.

A directory is resumed only with the same config (its fingerprint), the same shard, dialogue
ids this version recognises, and the same scenarios, tools, worlds and ``personas.source`` rows
its stored dialogues ran (the config names those files by path, so their digests in the
manifest tell an edit); a changed persona schema is kept and said. Each refusal is a
:class:`~spasm.errors.UserError` that says how to resume or replace the run.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from spasm.acting import tool_changes, tools_record
from spasm.config import RunConfig, config_differences
from spasm.dataset.lock import LOCK_FILE
from spasm.dataset.outputs import check_output
from spasm.dataset.persona_rows import persona_of
from spasm.dataset.store import RunStore
from spasm.errors import UserError
from spasm.personas import load_schema
from spasm.personas.sources import SourcePersonas, load_source
from spasm.runplan import Shard, legacy_dialogue_id, plan, resume_check
from spasm.scenarios import digest_record, run_scenarios, scenario_changes, scenarios_record

__all__ = ["ResumeCheck", "schema_digest"]

log = logging.getLogger("spasm")


def schema_digest(config: RunConfig) -> str:
    """The persona schema's content (as parsed: comments and layout do not count)."""
    schema = load_schema(config.personas.schema_file)
    return hashlib.sha256(schema.model_dump_json().encode()).hexdigest()[:16]


class ResumeCheck:
    """The checks of one run directory (:meth:`check`), and what they found for the run's
    manifest: the records of its scenarios, tools and persona source, its shard record and the
    digest of the schema its stored personas were drawn from."""

    def __init__(self, config: RunConfig, run_dir: Path, store: RunStore, shard: Shard | None,
                 *, overwrite: bool) -> None:
        self.config = config
        self.run_dir = run_dir
        self.store = store
        self.shard = shard
        self.overwrite = overwrite
        #: ``--shard I/N``: the shard's record (the stored one, on a resume).
        self.shard_record = shard.record() if shard is not None else None
        #: Digest of the persona schema the stored personas were drawn from (config.json).
        self.persona_schema: str | None = None
        #: What the manifest records of the run's scenarios (:func:`scenarios_record`),
        #: ``None`` in a run without scenarios or one whose manifest has no such record (an
        #: older run).
        self.scenarios: dict[str, Any] | None = None
        #: A run with tools: what the manifest records of its tools and worlds
        #: (:func:`spasm.acting.tools_record`).
        self.tools: dict[str, Any] | None = None
        #: The same for the rows of ``personas.source`` (``None``: no source, or a run
        #: whose manifest has no such record), and the file as read for it.
        self.personas_source: dict[str, Any] | None = None
        self.loaded_source: SourcePersonas | None = None

    def check(self) -> bool:
        """Decide what to do with an existing ``--out``: ``True`` when it must be replaced."""
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise UserError(f"--out {self.run_dir} is a file; name a directory for the run.")
        check_output(self.run_dir, "generate", overwrite=self.overwrite)
        self.scenarios = scenarios_record(self.config)
        self.tools = tools_record(self.config, run_scenarios(self.config))
        self.personas_source = self._source_record()
        cfg_file = self.run_dir / "config.json"
        if not cfg_file.exists():
            if self.run_dir.exists() and any(
                p.name != LOCK_FILE for p in self.run_dir.iterdir()
            ) and not self.overwrite:
                raise UserError(
                    f"{self.run_dir} exists and is not a spasm run directory; choose another "
                    "--out or pass --overwrite."
                )
            return self.overwrite and self.run_dir.exists()
        try:
            old = json.loads(cfg_file.read_text(encoding="utf-8"))
            assert isinstance(old, dict)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AssertionError):
            if self.overwrite:
                return True
            raise UserError(
                f"{cfg_file} is damaged, so the run cannot be resumed safely. Pass --overwrite to "
                "replace the run, or use another --out."
            ) from None
        if old.get("fingerprint") != self.config.fingerprint():
            if not self.overwrite:
                changed = config_differences(old.get("config"), self.config.redacted())
                raise UserError(
                    f"{self.run_dir} holds a run with a different config ({changed}), so it "
                    "cannot be resumed. Use another --out, or --overwrite to replace it."
                )
            return True
        if not self.overwrite:  # resuming: the same shard (or none) as before
            self.shard_record = resume_check(self.run_dir, self.shard)
            self._refuse_legacy_ids()
            self._check_schema(old.get("persona_schema"))
            self._check_scenarios()
            self._check_tools()
            self._check_personas_source()
        return self.overwrite

    def _source_record(self) -> dict[str, Any] | None:
        """What the manifest records of the rows of ``personas.source`` (by source id, as the
        file gives them: an edited, added or removed row changes it); ``None`` without one."""
        pc = self.config.personas
        if pc.source is None:
            return None
        source = load_source(pc.source, load_schema(pc.schema_file), pc.field_map)
        self.loaded_source = source
        rows: dict[str, Any] = {c.source_id: c.raw for c in source.accepted}
        for r in source.rejected:  # a rejected row edited into a usable one counts as well
            rows[str(r["source_id"])] = {k: v for k, v in r.items() if k not in ("draw", "reasons")}
        return digest_record(pc.source, rows)

    def _manifest_record(self, key: str) -> dict[str, Any] | None:
        """The record the run's manifest keeps under ``key``, or ``None`` (no manifest yet, an
        unreadable one, or an older manifest without it)."""
        try:
            manifest = json.loads((self.run_dir / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        stored = manifest.get(key) if isinstance(manifest, dict) else None
        return stored if isinstance(stored, dict) and isinstance(stored.get("sha256"), str) else None

    def _check_personas_source(self) -> None:
        """A resumed run keeps the personas it read from ``personas.source``: an edit of the
        file would change nothing ("0 new"), so it is refused, as a scenario file's is."""
        now = self.personas_source
        if now is None or not self.store.parts("personas"):
            return  # no source, or no personas stored yet: they are read from the file as it is
        stored = self._manifest_record("personas_source")
        if stored is None:
            self.personas_source = None  # an older run: no record, so no check
            return
        if stored["sha256"] == now["sha256"]:
            return
        raise UserError(
            f"the persona file {self.config.personas.source} changed since {self.run_dir} was "
            f"started ({scenario_changes(stored, now, 'rows')}); its stored personas are the rows "
            "as they were, so resuming would not apply the edit. Restore the file as it was to "
            "resume, or start a new run with another --out (or --overwrite to replace this one)."
        )

    def _check_schema(self, drawn_with: Any) -> None:
        """A resumed run keeps the personas it drew: say so when the schema changed since
        (the config names the schema file, so its fingerprint cannot see an edit)."""
        if not isinstance(drawn_with, str) or not self.store.parts("personas"):
            return  # an older run, or no personas yet (they will be drawn from this schema)
        self.persona_schema = drawn_with  # what the stored personas were drawn from
        if drawn_with != schema_digest(self.config):
            log.warning(
                "the persona schema %s changed since %s drew its personas; they are kept, so the "
                "edit does not apply to this run. Restore the schema, or pass --overwrite (or "
                "another --out) to draw the personas again.",
                self.config.personas.schema_file or "(bundled)", self.run_dir)

    def _check_scenarios(self) -> None:
        """A resumed run runs the scenarios its stored dialogues ran: the config names a
        scenario file, so its fingerprint cannot see an edit; the digest its manifest records
        can. A run whose manifest records none (an older run) resumes unchecked and goes on
        recording none."""
        try:
            manifest = json.loads((self.run_dir / "manifest.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return  # killed before its first manifest: nothing ran, record the scenarios now
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            if self.scenarios is not None and self.store.parts("dialogues"):
                log.warning("%s/manifest.json cannot be read (%s), so the scenarios its stored "
                            "dialogues ran cannot be checked against %s; they are recorded anew.",
                            self.run_dir, exc, self.scenarios["source"])
            return
        if not isinstance(manifest, dict):
            return
        stored = manifest.get("scenarios")
        if not isinstance(stored, dict) or not isinstance(stored.get("sha256"), str):
            self.scenarios = None  # an older run: no record, so no check
            return
        now = self.scenarios or {"source": "(no scenarios)", "count": 0, "sha256": ""}
        if stored["sha256"] == now["sha256"] or not self.store.parts("dialogues"):
            return  # the same scenarios, or no dialogue ran with the old ones
        source = stored.get("source") or now["source"]
        where = "the config's inline scenarios" if source == "config" else f"the scenario file {source}"
        raise UserError(
            f"{where} changed since {self.run_dir} was started ({scenario_changes(stored, now)}); "
            "its stored dialogues ran the scenarios as they were, so resuming would mix the two "
            "under the same scenario ids. Restore the file as it was to resume, or start a new "
            "run with another --out (or --overwrite to replace this one)."
        )

    def _check_tools(self) -> None:
        """A resumed run with tools runs the tools and worlds its stored dialogues ran (their
        files are named by path: the fingerprint cannot see an edit, the manifest's digest
        can)."""
        if self.tools is None or not self.store.parts("dialogues"):
            return
        try:
            manifest = json.loads((self.run_dir / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return  # no readable manifest: nothing to compare with (recorded anew)
        stored = manifest.get("tools") if isinstance(manifest, dict) else None
        if not isinstance(stored, dict) or stored.get("sha256") == self.tools["sha256"]:
            return
        raise UserError(
            f"the tools or worlds changed since {self.run_dir} was started "
            f"({tool_changes(stored, self.tools)}); its stored dialogues acted with them as they "
            "were, so resuming would mix the two. Restore the files to resume, or start a new run "
            "with another --out (or --overwrite to replace this one).")

    def _refuse_legacy_ids(self) -> None:
        """A run whose dialogue ids an older spasm built with unescaped ``-`` in backend names
        is refused: resuming it would not recognise one stored dialogue and pay for all again."""
        names = {*self.config.backends, *self.config.conditions}
        if not any("-" in n or "%" in n for n in names):
            return  # the ids are the same in every version
        try:
            table = self.store.read("personas")
            personas = [persona_of(r) for r in table.to_pylist()] if table is not None else []
            done = self.store.done_dialogue_ids() if personas else set()
        except Exception:  # a damaged part: repaired (and its dialogues redone) by _run
            return
        stale = done - {s.dialogue_id for s in plan(self.config, personas, self.shard)}
        if not stale:
            return
        legacy = stale & {s.dialogue_id for s in plan(
            self.config, personas, self.shard, ids=legacy_dialogue_id)}
        if legacy:
            raise UserError(
                f"{self.run_dir} was written by an older spasm, whose dialogue ids join backend "
                f"names containing '-' unescaped (e.g. {min(legacy)!r}), so a resume would not "
                f"recognise its {len(legacy):,} stored dialogues and would generate them again. "
                "Use another --out, or --overwrite to regenerate the run."
            )

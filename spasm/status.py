"""``spasm status RUN_DIR``: where a run stands, read through the dataset package.

Planned, done, quarantined and still to do (from the manifest and the tables), tokens and cost
(from the call log), the schema version, damaged parts, and whether a process holds the run's
write lock right now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from spasm.dataset.integrity import find_damage
from spasm.dataset.lock import lock_holder
from spasm.dataset.outputs import is_run, replacement_leftovers
from spasm.dataset.reader import open_run
from spasm.errors import UserError
from spasm.run_summary import pacing_note

__all__ = ["RunStatus", "run_status"]


@dataclass(frozen=True)
class RunStatus:
    """A run's state, as ``spasm status`` prints it."""

    run_dir: Path
    status: str
    planned: int | None
    done: int
    quarantined: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None
    writer_pid: int | None
    damaged: list[str]
    schema_version: str
    #: Earlier versions of the run that an interrupted ``--overwrite`` left aside.
    replaced: tuple[Path, ...] = ()
    #: Per backend, its pacing, 429s and waits, as the manifest last recorded them.
    rate_limits: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def remaining(self) -> int | None:
        return None if self.planned is None else max(0, self.planned - self.done)

    def lines(self) -> list[str]:
        """Human-readable lines."""
        planned = "?" if self.planned is None else f"{self.planned:,}"
        out = [
            f"run:          {self.run_dir}  (format {self.schema_version})",
            f"status:       {self.status}",
            f"dialogues:    {self.done:,} done of {planned} planned; {self.quarantined:,} "
            f"quarantined; {self.remaining if self.remaining is not None else '?'} to do",
            f"tokens:       {self.prompt_tokens:,} prompt + {self.completion_tokens:,} completion",
        ]
        if self.cost is not None:
            out.append(f"cost:         {self.cost:.4f}")
        if self.writer_pid is not None:
            who = f"process {self.writer_pid}" if self.writer_pid > 0 else "another process"
            out.append(f"writer:       {who} is writing this run now")
        else:
            out.append("writer:       none (safe to resume, evaluate or export)")
        for name, r in sorted(self.rate_limits.items()):
            paced = pacing_note({name: r})
            limited = int(r.get("rate_limited") or 0)
            if not paced and not limited and float(r.get("held_s") or 0) < 0.05:
                continue
            now = "now" if self.status == "running" else "at the end"
            head = paced.replace(f"{name} paced", f"{name}: paced {now}", 1) if paced else (
                f"{name}: not paced {now}")
            out.append(f"rate limits:  {head}; {limited:,} 429s; paced {float(r.get('held_s') or 0):.1f} s; "
                       f"calls waited {float(r.get('retry_wait_s') or 0):.1f} s after 429s"
                       + (" (random 429s: not about the rate)" if r.get("state") == "overloaded" else ""))
        if self.damaged:
            out.append(f"DAMAGED:      {'; '.join(self.damaged)} (rerun generate to redo them)")
        for aside in self.replaced:
            out.append(f"REPLACED:     an interrupted --overwrite left the previous run at {aside}; "
                       "rerun the generate command to finish it (the previous run comes back if "
                       "this one holds no dialogue yet, and is deleted otherwise)")
        return out


def _count(run_dir: Path, table: str) -> set[str]:
    run = open_run(run_dir, verify=False)
    if not run.has(table):
        return set()
    ids = run.table(table, ["dialogue_id"]).column("dialogue_id")
    return {str(v) for v in pc.unique(ids).to_pylist()}


def run_status(run_dir: str | Path) -> RunStatus:
    """Read the state of a run directory (never writes to it)."""
    path = Path(run_dir)
    replaced = tuple(replacement_leftovers(path))
    if not path.exists() and replaced:
        raise UserError(
            f"{path} does not exist, but an interrupted --overwrite left the previous run at "
            f"{replaced[0]}; rerun the same generate command to restore it (or move it back to "
            f"{path} yourself)."
        )
    if path.is_dir() and not is_run(path):
        raise UserError(
            f"{path} is not a spasm run directory (it has no config.json, manifest.json or "
            ".commits/); pass a directory that `spasm generate`, `merge` or `import` wrote."
        )
    run = open_run(path, verify=False)
    manifest = run.manifest
    done = _count(path, "dialogues")
    failed = _count(path, "errors") - done
    prompt = completion = 0
    if run.has("calls"):
        calls = run.table("calls", ["prompt_tokens", "completion_tokens"])
        prompt = int(pc.sum(calls.column("prompt_tokens")).as_py() or 0)
        completion = int(pc.sum(calls.column("completion_tokens")).as_py() or 0)
    counts = manifest.get("counts") or {}
    usage = manifest.get("usage") or {}
    planned = counts.get("planned")
    writer = lock_holder(path)
    status = str(manifest.get("status") or manifest.get("kind") or "unknown")
    if status == "running" and writer is None:
        # The manifest says running, but no process holds the run: it was killed or crashed.
        status = ("interrupted (the manifest says running, but no process is writing it: it was "
                  "killed or crashed; rerun the same generate command to resume)")
    return RunStatus(
        run_dir=path,
        status=status,
        planned=int(planned) if isinstance(planned, int) else None,
        done=len(done),
        quarantined=len(failed),
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost=float(usage["cost"]) if isinstance(usage.get("cost"), int | float) else None,
        writer_pid=writer,
        damaged=[str(d) for d in find_damage(path)],
        schema_version=run.schema_version,
        replaced=replaced,
        rate_limits=_rate_limits(manifest.get("rate_limits")),
    )


def _rate_limits(value: Any) -> dict[str, dict[str, Any]]:
    """The manifest's ``rate_limits`` (absent from older manifests; anything else ignored)."""
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, dict)}

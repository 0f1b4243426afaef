"""``spasm merge``: the shards of one run into one run directory (docs/cluster.md).

:func:`merge_runs` first checks the shards, reading only their metadata and id columns, and
refuses with a :class:`~spasm.errors.UserError` naming the shard before anything is written:

* every shard is a readable run (``open_run`` verifies each committed part's checksum), not
  being written now, written by ``spasm generate --shard I/N``;
* all come from one config (``config.json`` ``fingerprint``), one schema version, one shard
  count N, drew the same persona set (the digest the shard records) and ran the same
  scenarios (the manifest's ``scenarios`` digest: a scenario file edited between shards is
  the same config; shards written before that record are not compared) with the same plugins
  (the manifest's ``plugins``);
* no two overlap (the same shard twice, a persona or a dialogue in two shards);
* none of the N is missing and every one finished (manifest ``status`` ``complete``), unless
  ``allow_partial``: then what is there is merged and the run's status is ``partial``.

It then streams every table through :meth:`RunStore.merge_parts
<spasm.dataset.store.RunStore.merge_parts>`, a k-way merge of the shards' sorted parts with
bounded memory, into a staging directory that is moved in whole, so ``out`` holds the merged
run or nothing. The rows equal the unsharded run's: personas, dialogues, turns and errors are
each in one shard; the persona candidates every shard rejected alike are kept once; the calls
table keeps every shard's calls (each shard drew the personas itself, so persona calls appear
once per shard that made them).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spasm.dataset.lock import LOCK_FILE, RunLock, lock_holder
from spasm.dataset.outputs import check_output
from spasm.dataset.reader import Run, open_run
from spasm.dataset.store import RunStore
from spasm.errors import UserError
from spasm.scenarios import scenario_changes

__all__ = ["MergeResult", "ShardRun", "inspect_shard", "merge_runs"]

#: Tables in the order they are merged (others found in the shards follow, sorted).
_ORDER = ("personas", "persona_rejections", "dialogues", "turns", "calls", "errors")


@dataclass(frozen=True)
class ShardRun:
    """One shard directory, opened and verified."""

    path: Path
    run: Run
    config: dict[str, Any]
    fingerprint: str | None
    schema_version: str
    status: str
    shard: dict[str, Any] | None

    @property
    def spec(self) -> str:
        return str(self.shard.get("spec")) if self.shard else "?"


@dataclass
class MergeResult:
    """What a merge wrote."""

    out: Path
    status: str
    shards: list[ShardRun]
    missing: list[str] = field(default_factory=list)
    unfinished: list[Path] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def line(self) -> str:
        """The one-line summary the CLI prints."""
        counts = ", ".join(f"{t} {n:,}" for t, n in self.rows.items())
        more = ""
        if self.missing or self.unfinished:
            gaps = [f"shard {s} missing" for s in self.missing]
            gaps += [f"{p} unfinished" for p in self.unfinished]
            more = f"; PARTIAL: {', '.join(gaps)}"
        return f"merged {len(self.shards)} shards into {self.out}: {counts}; {self.elapsed_s:.1f}s{more}"


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is damaged ({exc}); the shard cannot be merged.") from None
    return data if isinstance(data, dict) else {}


def inspect_shard(path: Path) -> ShardRun:
    """Open one shard for merging (checksums verified), or raise naming what is wrong."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"shard {path} does not exist (pass the --out of each `spasm generate "
                        "--shard I/N`).")
    pid = lock_holder(path)
    if pid is not None:
        raise UserError(f"shard {path} is being written by process {pid}; wait for it to "
                        "finish, then merge.")
    run = open_run(path)
    cfg = _json(path / "config.json")
    manifest = run.manifest
    if not cfg or not manifest:
        raise UserError(f"{path} is not a generated run (no config.json or manifest.json); "
                        "merge the directories `spasm generate --shard I/N` wrote.")
    shard = manifest.get("shard")
    return ShardRun(path, run, cfg, cfg.get("fingerprint"), run.schema_version,
                    str(manifest.get("status") or "unknown"), shard if isinstance(shard, dict) else None)


def _ids(run: Run, table: str, column: str) -> Iterator[str]:
    if not run.has(table):
        return
    for batch in run.batches(table, columns=[column]):
        yield from (str(v) for v in batch.column(0).to_pylist())


def _differs(shards: list[ShardRun], what: str, value: Callable[[ShardRun], Any], why: str) -> None:
    first = shards[0]
    for s in shards[1:]:
        if value(s) != value(first):
            raise UserError(f"shards {first.path} and {s.path} have different {what} "
                            f"({value(first)} vs {value(s)}): {why}. Nothing was written.")


def _check_same_run(shards: list[ShardRun]) -> None:
    for s in shards:
        if s.shard is None:
            raise UserError(f"{s.path} is not a shard: its manifest records no shard. Merge the "
                            "run directories of `spasm generate --shard I/N`; nothing was written.")
    first = shards[0]
    for s in shards[1:]:
        if s.fingerprint != first.fingerprint:
            from spasm.config import config_differences

            changed = config_differences(first.config.get("config"), s.config.get("config"))
            raise UserError(
                f"shard {s.path} comes from a different config than {first.path} (fingerprint "
                f"{s.fingerprint} vs {first.fingerprint}: {changed}); only shards of one config "
                "merge. Nothing was written."
            )
    _differs(shards, "schema versions", lambda s: s.schema_version,
             "they were written by different spasm versions; resume the older with the newer")
    _differs(shards, "shard counts", lambda s: s.shard and s.shard.get("count"),
             "they split the run into different numbers of shards")
    _differs(shards, "persona sets", lambda s: s.shard and s.shard.get("personas_sha256"),
             "they drew different personas (an LLM validator or crafter answered differently); "
             "rerun them with personas.llm_validate/llm_craft off or at temperature 0")
    _check_scenarios(shards)
    _check_plugins(shards)


def _check_plugins(shards: list[ShardRun]) -> None:
    """Shards that record their plugins (manifest ``plugins``) ran with the same ones: a
    plugin's backend, projection or scan may have made the rows."""
    recorded = [(s, s.run.manifest["plugins"]) for s in shards
                if isinstance(s.run.manifest.get("plugins"), list)]

    def names(plugins: list[Any]) -> str:
        return ", ".join(f"{p.get('distribution') or p.get('entry_point')} {p.get('version')}"
                         for p in plugins if isinstance(p, dict)) or "none"

    for s, plugins in recorded[1:]:
        first, before = recorded[0]
        if plugins != before:
            raise UserError(
                f"shards {first.path} and {s.path} ran with different plugins ({names(before)} "
                f"vs {names(plugins)}): what a plugin registers may have made their rows. Rerun "
                "the shards made with the other plugins (each into a fresh --out), then merge. "
                "Nothing was written.")


def _check_scenarios(shards: list[ShardRun]) -> None:
    """Shards that record their scenarios (manifest ``scenarios``) ran the same ones."""
    recorded = [(s, s.run.manifest["scenarios"]) for s in shards
                if isinstance(s.run.manifest.get("scenarios"), dict)]
    for s, record in recorded[1:]:
        first, before = recorded[0]
        if record.get("sha256") != before.get("sha256"):
            source = record.get("source") or before.get("source")
            what = "inline scenarios" if source == "config" else f"scenario file {source}"
            raise UserError(
                f"shards {first.path} (shard {first.spec}) and {s.path} (shard {s.spec}) ran "
                f"different scenarios: the {what} changed between them "
                f"({scenario_changes(before, record)}); their dialogues would mix two versions "
                "under the same scenario ids. Restore the file and rerun the shards made with "
                "the other version (each into a fresh --out), then merge. Nothing was written."
            )


def _check_overlap(shards: list[ShardRun]) -> None:
    by_index: dict[int, ShardRun] = {}
    for s in shards:
        assert s.shard is not None
        i = int(s.shard["index"])
        if i in by_index:
            raise UserError(f"{by_index[i].path} and {s.path} are both shard {s.spec}: they "
                            "overlap. Merge each shard once; nothing was written.")
        by_index[i] = s
    # A group run's shards share personas (its seats draw from the whole set): each keeps
    # them all and the merge keeps each once; its dialogues must not overlap.
    group = any(s.run.has("participants") for s in shards)
    keyed = (("dialogues", "dialogue_id"),) if group else (
        ("personas", "persona_id"), ("dialogues", "dialogue_id"))
    for table, column in keyed:
        owner: dict[str, ShardRun] = {}
        for s in shards:
            for key in _ids(s.run, table, column):
                other = owner.setdefault(key, s)
                if other is not s:
                    raise UserError(f"shards {other.path} and {s.path} overlap: both hold "
                                    f"{column} {key!r}. Nothing was written.")


def _gaps(shards: list[ShardRun]) -> tuple[list[str], list[Path]]:
    assert shards[0].shard is not None
    count = int(shards[0].shard["count"])
    present = {int(s.shard["index"]) for s in shards if s.shard is not None}
    missing = [f"{i}/{count}" for i in range(count) if i not in present]
    unfinished = [s.path for s in shards if s.status != "complete"]
    return missing, unfinished


def _refuse_gaps(shards: list[ShardRun], missing: list[str], unfinished: list[Path]) -> None:
    problems = [f"shard {m} is missing" for m in missing]
    problems += [f"shard {s.spec} in {s.path} is unfinished (status {s.status})"
                 for s in shards if s.path in unfinished]
    raise UserError(
        "; ".join(problems) + ". Run or finish those shards (rerun the same `spasm generate "
        "--shard I/N` command), or pass --allow-partial to merge what is there. Nothing was written."
    )


def _check_out(out: Path, shards: list[ShardRun]) -> bool:
    """Whether ``out`` exists (and may take the merge: empty, or only its shards inside)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; name a directory for the merged run.")
    for s in shards:
        if s.path.resolve() == out.resolve():
            raise UserError(f"--out {out} is one of the shards; name a new directory.")
    if not out.exists():
        return False
    extra = [p.name for p in out.iterdir() if p.name not in ("shards", LOCK_FILE)]
    if extra:
        raise UserError(f"--out {out} exists and holds {', '.join(sorted(extra)[:3])}; merge "
                        "into a new directory (or one that holds only its shards/).")
    return True


def _sum_usage(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {"total_tokens": 0, "cost": 0.0, "cache_hits": 0}
    by_role: dict[str, Counter[str]] = {}
    outcomes: Counter[str] = Counter()
    for m in manifests:
        usage = m.get("usage") or {}
        for k in total:
            total[k] += usage.get(k) or 0
        for role, counts in (usage.get("by_role") or {}).items():
            by_role.setdefault(role, Counter()).update(counts)
        outcomes.update(usage.get("call_outcomes") or {})
    return {**total, "by_role": {r: dict(c) for r, c in by_role.items()},
            "call_outcomes": dict(outcomes)}


def _manifest(shards: list[ShardRun], result: MergeResult) -> dict[str, Any]:
    manifests = [s.run.manifest for s in shards]
    base = dict(manifests[0])
    counts = [m.get("counts") or {} for m in manifests]
    base.update({
        "status": result.status,
        "updated_at": datetime.now(UTC).isoformat(),
        "started_at": min(str(m.get("started_at") or "") for m in manifests),
        "counts": {"planned": sum(c.get("planned") or 0 for c in counts),
                   "completed": sum(c.get("completed") or 0 for c in counts),
                   "rows": dict(result.rows)},
        "usage": _sum_usage(manifests),
        "timing": {"elapsed_s_by_shard": {s.spec: (s.run.manifest.get("timing") or {}).get(
            "elapsed_s") for s in shards}, "merge_s": result.elapsed_s},
        "stopped": None,
        "failed": None,
        "merged_from": [{"dir": str(s.path), "shard": s.spec, "status": s.status} for s in shards],
        "missing_shards": result.missing,
    })
    base.pop("shard", None)
    return base


def _tables(shards: list[ShardRun]) -> list[str]:
    found = {t for s in shards for t in s.run.tables()}
    return [t for t in _ORDER if t in found] + sorted(found - set(_ORDER))


def _write(stage: Path, shards: list[ShardRun], result: MergeResult, config: dict[str, Any] | None,
           t0: float) -> None:
    store = RunStore(stage)
    store.create()
    for table in _tables(shards):
        sources = [f for s in shards for f in s.run.files(table)]
        # Calls are never de-duplicated: each shard's calls were made, the merge keeps them all.
        store.merge_parts(table, sources, dedupe=table != "calls")
        result.rows[table] = sum(_rows(f) for f in store.parts(table))
    store.write_json("config.json", config or shards[0].config)
    result.elapsed_s = time.perf_counter() - t0
    store.write_json("manifest.json", _manifest(shards, result))
    shutil.rmtree(store.tmp, ignore_errors=True)


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def _move_in(stage: Path, out: Path) -> None:
    """Move the staged run's entries into an existing ``out``: tables first (a reader sees
    each whole or not at all), then the markers, then the manifest."""
    entries = sorted(stage.iterdir(), key=lambda p: (p.name == "manifest.json", p.name == ".commits",
                                                      p.name))
    for entry in entries:
        if entry.name == LOCK_FILE:
            continue
        os.replace(entry, out / entry.name)
    shutil.rmtree(stage, ignore_errors=True)


def merge_runs(
    shards: Sequence[str | Path],
    out: str | Path,
    allow_partial: bool = False,
    *,
    config: dict[str, Any] | None = None,
    lock: bool = True,
) -> MergeResult:
    """Merge shard directories into the run directory ``out`` (see the module docstring).

    ``out`` must not exist, be empty, or hold only its ``shards/`` (the Ray executor's layout).
    ``config`` replaces the ``config.json`` taken from the first shard (the Ray executor gives
    the run's own, whose limits the shards shared). With ``lock=False`` the caller holds
    ``out``'s run lock.

    Raises:
        UserError: a shard is mismatched, overlapping, missing or unfinished (naming it);
            nothing is written.
    """
    t0 = time.perf_counter()
    paths = [Path(p) for p in shards]
    if not paths:
        raise UserError("name the shard directories to merge (spasm merge SHARD_DIR... --out DIR)")
    if len({p.resolve() for p in paths}) < len(paths):
        raise UserError("a shard directory is named twice; name each once.")
    runs = [inspect_shard(p) for p in paths]
    _check_same_run(runs)
    _check_overlap(runs)
    missing, unfinished = _gaps(runs)
    if (missing or unfinished) and not allow_partial:
        _refuse_gaps(runs, missing, unfinished)
    out = Path(out)
    check_output(out, "merge")  # never into a run's tables, over its files or over other files
    exists = _check_out(out, runs)
    runs.sort(key=lambda s: int(s.shard["index"]) if s.shard else 0)
    status = "partial" if missing or unfinished else "complete"
    result = MergeResult(out, status, runs, missing, unfinished)
    stage = (out / f".merge-{uuid.uuid4().hex[:8]}" if exists
             else out.parent / f".{out.name}.merging-{uuid.uuid4().hex[:8]}")
    stage.parent.mkdir(parents=True, exist_ok=True)
    try:
        with RunLock(out) if exists and lock else RunLock(stage):
            _write(stage, runs, result, config, t0)
            if exists:
                _move_in(stage, out)
            else:
                os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return result

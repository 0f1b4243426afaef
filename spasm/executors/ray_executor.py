"""``spasm generate --executor ray``: the shards of a run as Ray tasks, then one merge.

Layout: ``OUT/shards/<i>-of-<N>/`` is shard ``i/N``, an ordinary run directory that each Ray
task writes by running the ordinary :class:`~spasm.engine.Engine` with ``--shard i/N``; when
every shard is complete they are merged (:func:`spasm.dataset.merge.merge_runs`) into ``OUT``
itself. ``OUT`` must be a path every Ray worker reaches (a shared filesystem).

* A shard whose worker dies (a node lost, an OOM kill) is retried by Ray (``max_retries``);
  the retry resumes the shard directory like any rerun, so nothing is lost or duplicated.
* A rerun submits only the shards that are not complete, and does nothing at all when ``OUT``
  already holds the merged run.
* One progress bar counts the dialogues of all shards (read from the manifests the shards
  update at every flush).
* Provider limits hold run-wide by splitting them: at most ``W`` shards run at once (the
  cluster's CPUs over ``cpus_per_shard``, never more than any backend's ``max_concurrency``
  or ``rpm`` allows), and each gets ``1/W`` of every backend's ``max_concurrency``, ``rpm``
  and ``tpm`` (:func:`~spasm.executors.shards.share_limits`); the budget caps are split over
  all N shards. Deterministic, and no coordination between workers is needed.

Ray is an optional extra (``pip install 'spasm[ray]'``); it is imported only here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spasm.dataset.lock import LOCK_FILE, RunLock
from spasm.dataset.merge import MergeResult, merge_runs
from spasm.dataset.outputs import check_output
from spasm.errors import RunError, SpasmError, UserError
from spasm.executors.shards import parallel_shards, share_limits
from spasm.finish import write_reports
from spasm.raycluster import CONNECT_TIMEOUT_S, INSTALL_HINT, check_address, import_ray
from spasm.runplan import Shard

__all__ = ["CONNECT_TIMEOUT_S", "INSTALL_HINT", "RayRun", "check_address", "import_ray", "run_with_ray"]

@dataclass
class RayRun:
    """What a Ray-executed run did."""

    out: Path
    shards: int
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    merged: MergeResult | None = None
    stopped: str | None = None
    failed: str | None = None
    #: ``OUT`` already held the merged run: nothing was started.
    nothing_to_do: bool = False

    def line(self) -> str:
        """The one-line summary the CLI prints."""
        if self.nothing_to_do:
            return f"{self.out} already holds the merged run of {self.shards} shards; nothing to do"
        done = f"{self.shards} shards ({len(self.ran)} run, {len(self.skipped)} already complete)"
        parts = [done]
        errors = sum(int(r.get("errors") or 0) for r in self.results.values())
        if errors:
            parts.append(f"{errors} dialogues quarantined")
        if self.merged is not None:
            parts.append(self.merged.line())
        if self.stopped:
            parts.append(f"STOPPED: {self.stopped}")
        if self.failed:
            parts.append(f"FAILED: {self.failed}")
        return "; ".join(parts)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _existing_count(out: Path) -> int | None:
    """The shard count of the shard directories already in ``OUT/shards``."""
    counts = set()
    for d in (out / "shards").glob("*-of-*"):
        try:
            counts.add(int(d.name.rsplit("-of-", 1)[1]))
        except ValueError:
            continue
    if len(counts) > 1:
        raise UserError(f"{out / 'shards'} holds shards of {sorted(counts)}-way splits; keep one "
                        "split (delete the others) or use another --out.")
    return counts.pop() if counts else None


def _prepare_out(out: Path, config: Any, shards: int | None, overwrite: bool) -> int:
    """Check (or clear, with ``overwrite``) ``OUT``; returns the number of shards."""
    cfg = _json(out / "config.json")
    known = bool(cfg) or (out / "shards").is_dir()
    if not known and any(p.name != LOCK_FILE for p in out.iterdir()):
        raise UserError(f"{out} exists and is not a spasm run directory; choose another --out.")
    if overwrite and known:
        for entry in out.iterdir():
            if entry.name != LOCK_FILE:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        cfg = {}
    if cfg and cfg.get("fingerprint") != config.fingerprint():
        raise UserError(f"{out} holds a run with a different config, so it cannot be resumed. "
                        "Use another --out, or --overwrite to replace it.")
    existing = _existing_count(out)
    if shards is not None and existing is not None and shards != existing:
        raise UserError(f"{out} holds a run split into {existing} shards; rerun with --shards "
                        f"{existing}, or --overwrite to start again with {shards}.")
    return shards or existing or 0


def _merged(out: Path, config: Any, count: int) -> bool:
    manifest = _json(out / "manifest.json")
    return (manifest.get("status") == "complete" and len(manifest.get("merged_from") or []) == count
            and _json(out / "config.json").get("fingerprint") == config.fingerprint())


def _complete(run_dir: Path, shard: Shard, config: Any) -> bool:
    manifest = _json(run_dir / "manifest.json")
    return (manifest.get("status") == "complete"
            and (manifest.get("shard") or {}).get("spec") == str(shard)
            and _json(run_dir / "config.json").get("fingerprint") == config.fingerprint())


def _run_shard(config_data: dict[str, Any], run_dir: str, index: int, count: int,
               options: dict[str, Any]) -> dict[str, Any]:
    """The body of one Ray task: the ordinary engine on one shard (in the worker)."""
    import anyio

    from spasm.config import parse_config
    from spasm.engine import Engine

    config = parse_config(config_data, f"<shard {index}/{count}>")
    engine = Engine(config, Path(run_dir), shard=Shard(index, count), progress=False, **options)
    summary = anyio.run(engine.run)
    return {"planned": summary.planned, "completed": summary.completed, "new": summary.new,
            "errors": summary.errors, "stopped": summary.stopped, "failed": summary.failed,
            "line": summary.line()}


def _planned_estimate(config: Any) -> int:
    """The plan's size from the config's counts (``RunConfig.plan_factors``: a group run's
    group dialogues), until the shards' manifests count it."""
    return math.prod(config.plan_factors()[0])


class _Progress:
    """One bar for the whole run, fed by the shards' manifests."""

    def __init__(self, out: Path, shards: list[Shard], config: Any, enabled: bool | None) -> None:
        from tqdm import tqdm

        self._dirs = [out / "shards" / s.dirname for s in shards]
        self._guess = max(1, _planned_estimate(config) // max(1, len(shards)))
        planned, done = self._read()
        self.bar = tqdm(total=planned, initial=done, unit="dlg", desc="dialogues (all shards)",
                        disable={True: False, False: True, None: None}[enabled], dynamic_ncols=True)

    def _read(self) -> tuple[int, int]:
        planned = done = 0
        for d in self._dirs:
            counts = _json(d / "manifest.json").get("counts") or {}
            planned += int(counts.get("planned") or self._guess)
            done += int(counts.get("completed") or 0)
        return planned, done

    def poll(self) -> None:
        planned, done = self._read()
        if planned != self.bar.total:
            self.bar.total = planned
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        self.poll()
        self.bar.close()


def _raise_task_error(ray: Any, exc: BaseException, shard: Shard, run_dir: Path, retries: int) -> None:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, SpasmError):
        kind = UserError if isinstance(cause, UserError) else RunError
        raise kind(f"shard {shard} ({run_dir}): {cause}") from None
    if isinstance(exc, ray.exceptions.RayTaskError) and cause is not None:
        raise RunError(f"shard {shard} ({run_dir}) failed: {type(cause).__name__}: {cause}") from exc
    raise RunError(
        f"shard {shard} ({run_dir}) was lost {retries + 1} times ({type(exc).__name__}: {exc}); "
        "its committed dialogues are kept: run the same command again to resume it."
    ) from exc


def _execute(ray: Any, run: RayRun, config: Any, todo: list[Shard], all_shards: list[Shard],
             options: Mapping[str, Any], cpus_per_shard: float, max_retries: int,
             progress: bool | None) -> None:
    slots = max(1, int(float(ray.cluster_resources().get("CPU", 1)) // cpus_per_shard))
    ways = parallel_shards(config, len(todo), slots)
    shard_config = share_limits(config, ways, len(all_shards)).model_dump(mode="json")
    task = ray.remote(num_cpus=cpus_per_shard, max_retries=max_retries,
                      retry_exceptions=False)(_run_shard)
    bar = _Progress(run.out, all_shards, config, progress)
    queue = list(todo)
    running: dict[Any, Shard] = {}
    try:
        while queue or running:
            while queue and len(running) < ways:  # never more than `ways` share the limits
                s = queue.pop(0)
                run_dir = run.out / "shards" / s.dirname
                running[task.remote(shard_config, str(run_dir), s.index, s.count, dict(options))] = s
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            bar.poll()
            for ref in ready:
                s = running.pop(ref)
                try:
                    run.results[str(s)] = ray.get(ref)
                except Exception as exc:
                    _raise_task_error(ray, exc, s, run.out / "shards" / s.dirname, max_retries)
                run.ran.append(str(s))
    except BaseException:
        for ref in running:
            ray.cancel(ref, force=True)
        raise
    finally:
        bar.close()


def run_with_ray(
    config: Any,
    out: Path,
    *,
    shards: int | None = None,
    address: str | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    cpus_per_shard: float = 1.0,
    max_retries: int = 3,
    engine_options: Mapping[str, Any] | None = None,
) -> RayRun:
    """Run ``config`` as shards on Ray into ``out`` and merge them (see the module docstring).

    Connects to the cluster at ``address`` (else ``RAY_ADDRESS``, else a Ray already
    initialised in this process, else starts a local one). ``shards`` defaults to the count
    already in ``out/shards``, else one per slot of the cluster (at most one per persona).
    ``engine_options`` go to each shard's :class:`~spasm.engine.Engine` (tests pass
    ``simulate`` and ``sleep_scale``).
    """
    ray = import_ray()
    if not ray.is_initialized():
        check_address(address)
    out = Path(out).resolve()  # workers may not share the driver's working directory
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; name a directory for the run.")
    check_output(out, "generate", overwrite=overwrite)
    out.mkdir(parents=True, exist_ok=True)
    with RunLock(out):
        count = _prepare_out(out, config, shards, overwrite)
        if count and _merged(out, config, count):
            return RayRun(out, count, nothing_to_do=True)
        started = False
        if not ray.is_initialized():
            local = address is None and not os.environ.get("RAY_ADDRESS")
            handler = signal.getsignal(signal.SIGTERM)
            ray.init(address=address, **({"include_dashboard": False} if local else {}),
                     log_to_driver=False)
            if handler is not None and threading.current_thread() is threading.main_thread():
                # ray.init replaces it with sys.exit: put spasm's back, so SIGTERM stops the
                # run as without Ray (exit 143 with the resume hint).
                signal.signal(signal.SIGTERM, handler)
            started = True
        try:
            if not count:
                slots = int(float(ray.cluster_resources().get("CPU", 1)) // cpus_per_shard)
                count = max(1, min(max(1, slots), config.personas.n or slots))
            run = RayRun(out, count)
            all_shards = [Shard(i, count) for i in range(count)]
            todo = []
            for s in all_shards:
                if _complete(out / "shards" / s.dirname, s, config):
                    run.skipped.append(str(s))
                else:
                    todo.append(s)
            _execute(ray, run, config, todo, all_shards, engine_options or {}, cpus_per_shard,
                     max_retries, progress)
            _settle(run, config, all_shards)
            return run
        finally:
            if started:
                ray.shutdown()


def _settle(run: RayRun, config: Any, all_shards: list[Shard]) -> None:
    """Merge when every shard finished; otherwise say why not."""
    for spec, r in sorted(run.results.items()):
        if r.get("failed"):
            run.failed = f"shard {spec}: {r['failed']}"
        elif r.get("stopped"):
            run.stopped = f"shard {spec}: {r['stopped']}"
        elif r.get("completed", 0) < r.get("planned", 0):
            run.failed = (f"shard {spec}: {r['planned'] - r['completed']} dialogues are not done "
                          "(see its errors table); run the same command again to retry them")
    if run.failed or run.stopped:
        return
    dirs = [run.out / "shards" / s.dirname for s in all_shards]
    own = {"fingerprint": config.fingerprint(), "config": config.redacted()}
    run.merged = merge_runs(dirs, run.out, config=own, lock=False)
    write_reports(run.out, config.harness)

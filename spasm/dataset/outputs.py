"""Where a command may write: the one output-path check of every command that writes an output.

Every command that writes (``generate``, ``merge``, ``import``, ``export``, ``eval``, ``card``,
``personas``) calls :func:`check_output` on its ``--out`` before it writes anything. The rules:

* never inside a run's tables (``*.parquet``), its bookkeeping (``.commits/``, ``.tmp/``) or
  over its own files (``config.json``, ``manifest.json``, ``cache.sqlite``, ...), at any depth
  (a run nested in a run, such as ``RUN/shards/0-of-2``, is protected the same way);
* never over a run, unless the command writes runs (``generate`` resumes or replaces one;
  ``import --force`` replaces only an earlier import);
* ``--overwrite`` only over what the same command wrote before: each command that writes a
  directory leaves :data:`OUTPUT_MARKER` in it (:func:`mark_output`). A directory without the
  marker is replaced only when it holds nothing but that command's own file names (an output
  of a version that wrote no marker).

A replacement moves the old output aside as ``.NAME.replaced-XXXXXXXX`` (:func:`aside_path`)
and deletes it once the new one counts; a process killed in between leaves it there.
:func:`replacement_leftovers` finds it (``spasm status`` reports it) and
:func:`finish_replacement` restores or deletes it (a rerun does).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from spasm.dataset.files import atomic_write_json
from spasm.dataset.lock import LOCK_FILE, lock_holder
from spasm.errors import UserError

__all__ = ["OUTPUT_MARKER", "aside_path", "check_output", "finish_replacement", "is_run",
           "mark_output", "replacement_leftovers", "run_kind"]

log = logging.getLogger("spasm")

#: The marker a command leaves in the directory it wrote (``{"written_by": "spasm export"}``).
OUTPUT_MARKER = ".spasm-output"

#: A run directory's own files, which no command's output may replace.
RUN_FILES = frozenset({"config.json", "manifest.json", "cache.sqlite", LOCK_FILE, ".compaction.json",
                       "harness_report.json", "harness_report.md"})
#: A run directory's bookkeeping folders (every ``*.parquet`` entry is a table as well).
RUN_DIRS = frozenset({".commits", ".tmp"})


@dataclass(frozen=True)
class _Output:
    """What a command writes at ``--out``: a file, a directory of files, or a run directory."""

    kind: Literal["file", "dir", "run"]
    #: The names a ``dir`` output holds (an output from before the marker is recognised by them).
    names: frozenset[str] = frozenset()


#: The output of each command that writes one (a table as data, not checks spread around).
OUTPUTS: dict[str, _Output] = {
    "generate": _Output("run"),
    "merge": _Output("run"),
    "import": _Output("run"),
    "export": _Output("dir", frozenset({"README.md", "card.json", "data", "openai", "sharegpt"})),
    "eval": _Output("dir", frozenset({"metrics.json", "per_dialogue.parquet", "report.html",
                                      "compare.json", "figures.json", "embeddings-cache"})),
    "card": _Output("file"),
    "personas": _Output("file"),
}


def _manifest_kind(path: Path) -> str | None:
    try:
        data = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    kind = data.get("kind") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


def is_run(path: str | Path) -> bool:
    """Whether ``path`` is a run directory (or the shards of one: ``--executor ray``'s layout)."""
    p = Path(path)
    if not p.is_dir():
        return False
    if (p / "config.json").is_file() or (p / "manifest.json").is_file() or (p / ".commits").is_dir():
        return True
    return any(d.is_dir() for d in (p / "shards").glob("*-of-*"))


def run_kind(path: str | Path) -> Literal["generated", "import"] | None:
    """``"import"`` for a ``spasm import``, ``"generated"`` for any other run, ``None``: no run."""
    p = Path(path)
    if not is_run(p):
        return None
    return "import" if _manifest_kind(p) == "import" and not (p / "config.json").exists() else "generated"


def _owner(directory: Path) -> str | None:
    """The command whose marker ``directory`` holds (``None``: no readable marker)."""
    try:
        data = json.loads((directory / OUTPUT_MARKER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    written_by = data.get("written_by") if isinstance(data, dict) else None
    return written_by.removeprefix("spasm ") if isinstance(written_by, str) else None


def mark_output(directory: str | Path, command: str) -> None:
    """Mark ``directory`` as ``spasm COMMAND``'s output, so a later ``--overwrite`` may replace it.
    The content is fixed (no time, no version): identical outputs stay byte-identical."""
    atomic_write_json(Path(directory) / OUTPUT_MARKER, {"written_by": f"spasm {command}"})


def _refuse_inside_run(out: Path, command: str) -> None:
    target = out.resolve()
    for parent in target.parents:
        if not is_run(parent):
            continue
        first = target.relative_to(parent).parts[0]
        if first.endswith(".parquet") or first in RUN_DIRS:
            what = f"its table {first}" if first.endswith(".parquet") else f"its {first} folder"
        elif first in RUN_FILES:
            what = f"its {first}"
        else:
            continue
        raise UserError(
            f"--out {out} is inside the run {parent} ({what}); spasm {command} never writes into a "
            "run's tables or over its files. Choose a path outside the run (or a new folder in it, "
            f"e.g. {parent / command})."
        )


def _refuse_other_run(out: Path, command: str, source: Path) -> None:
    """An output about the run ``source`` never lands inside another run, where it would read
    as that run's (``spasm eval A --out B/eval`` would replace B's evaluation)."""
    target = out.resolve()
    mine = source.resolve()
    for parent in target.parents:
        if parent == mine or mine in parent.parents:
            return  # inside the run it describes (or a run nested in it): its own place
        if is_run(parent):
            raise UserError(
                f"--out {out} is inside the run {parent}, but spasm {command} is describing the "
                f"run {source}: it would read as {parent.name}'s own. Write it into {source} "
                f"(the default) or outside any run (e.g. {parent.parent / (source.name + '-' + command)}).")


def check_output(out: str | Path, command: str, *, overwrite: bool = False,
                 source: str | Path | None = None) -> bool:
    """Refuse an ``--out`` of ``spasm COMMAND`` that would destroy what it lands on (see the
    module docstring); returns whether ``out`` exists (a file or run to replace, a run to
    resume, a directory of this command's to replace).

    ``overwrite``: the command's ``--overwrite``/``--force``; an existing file or an earlier
    output of the command is replaced only with it (``eval`` passes ``True`` for its output
    inside the run it evaluates). ``source``: the run the output describes (``eval``,
    ``card``); the output may not lie inside another run.

    Raises:
        UserError: the path is inside a run's tables or over its files, over a run, inside
            another run than ``source``, over a directory another command (or the user)
            wrote, over a file without ``overwrite``, or of the wrong kind (exit 2).
    """
    spec = OUTPUTS[command]
    path = Path(out)
    _refuse_inside_run(path, command)
    if source is not None:
        _refuse_other_run(path, command, Path(source))
    if not path.exists():
        return False
    if spec.kind == "file":
        if path.is_dir():
            raise UserError(f"--out {path} is a directory; name the file to write.")
        if not overwrite:
            raise UserError(f"--out {path} exists; choose another file or pass --overwrite to "
                            "replace it.")
        return True
    if not path.is_dir():
        raise UserError(f"--out {path} is a file; name a directory for spasm {command} to write.")
    entries = sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE)
    if spec.kind == "run":
        kind = run_kind(path)
        if kind is None and entries:
            raise UserError(
                f"--out {path} exists and holds {', '.join(entries[:3])}"
                f"{', ...' if len(entries) > 3 else ''}, and is not a spasm run directory; spasm "
                f"{command} never writes over other files, even with --overwrite. Choose another --out."
            )
        if command == "import" and kind == "generated":
            raise UserError(f"{path} holds a generated run; import into another directory (--out).")
        return True
    if is_run(path):
        # A new folder in the run it describes (for eval, RUN/eval is that run's own
        # evaluation: never suggested for another run's).
        suggest = Path(source) / command if source is not None else path / command
        raise UserError(
            f"--out {path} is a run directory; spasm {command} never writes over a run, even with "
            f"--overwrite. Choose a new directory (e.g. {suggest})."
        )
    if not entries:
        return True
    owner = _owner(path)
    ours = owner == command or (owner is None and set(entries) <= spec.names)
    if not ours:
        by = f"spasm {owner}" if owner else "something other than spasm " + command
        raise UserError(
            f"--out {path} exists and is not empty: it holds files written by {by} ({', '.join(entries[:3])}"
            f"{', ...' if len(entries) > 3 else ''}); --overwrite replaces only an earlier spasm "
            f"{command} output. Choose another directory."
        )
    if not overwrite:
        raise UserError(f"--out {path} exists and is not empty (an earlier spasm {command} output); "
                        "choose another directory or pass --overwrite to replace it.")
    return True


# -- replacements ------------------------------------------------------------------------------
def aside_path(out: str | Path) -> Path:
    """Where an output being replaced waits until the new one counts: a hidden sibling."""
    out = Path(out)
    return out.parent / f".{out.name}.replaced-{uuid.uuid4().hex[:8]}"


def replacement_leftovers(out: str | Path) -> list[Path]:
    """Outputs of ``out`` set aside by a replacement that never finished (read-only)."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    return sorted(p for p in out.parent.glob(f".{out.name}.replaced-*") if p.is_dir())


def finish_replacement(out: str | Path, counts: Callable[[Path], bool] | None = None) -> list[str]:
    """Finish the replacements of ``out`` that a killed process left half done; returns what was
    done, one sentence each (the caller prints or logs them).

    The old output is put back when ``out`` is missing or ``counts(out)`` says the new one does
    not count yet (``generate``: no dialogue committed; then the new, empty run is deleted), and
    deleted otherwise, as the interrupted command would have done. An aside whose lock a live
    process holds is its own, and left alone. Call it holding ``out``'s run lock, if it has one.
    """
    out = Path(out)
    # A running replacement holds its aside's lock until its new output is locked: not ours.
    leftovers = [p for p in replacement_leftovers(out) if lock_holder(p) is None]
    if len(leftovers) > 1:  # which one is the original cannot be told safely: ask
        raise UserError(
            f"{len(leftovers)} earlier versions of {out} were set aside by interrupted "
            f"replacements ({', '.join(p.name for p in leftovers)}); keep the one you want "
            f"(move it to {out}) and delete the others, then rerun."
        )
    done: list[str] = []
    for aside in leftovers:
        if out.exists() and (counts is None or counts(out)):
            shutil.rmtree(aside, ignore_errors=True)
            done.append(f"deleted {aside}, the output that an interrupted replacement of {out} had "
                        "already replaced")
            continue
        if out.exists():
            shutil.rmtree(out)
        os.replace(aside, out)
        done.append(f"restored {out} from {aside.name}: a replacement of it was interrupted before "
                    "the new output held anything")
    for line in done:
        log.warning("%s", line)
    return done

"""Plugins: installed distributions that add to any extension kind of :mod:`spasm.registry`
(backends, projections, termination detectors, next-speaker policies, tools, export formats,
QA scans and embedders) through the entry-point group ``spasm.plugins`` (as simonw/llm's
plugins do).

A plugin declares one entry point or more in its package metadata::

    [project.entry-points."spasm.plugins"]
    my_plugin = "my_package.spasm_plugin"            # a module: importing it registers
    my_other = "my_package.spasm_plugin:register"    # a callable: called with no arguments

and registers with the decorators spasm uses itself: :func:`spasm.backends.register_backend`,
:func:`spasm.projection.register_projection`, :func:`spasm.termination.register_detector`,
:func:`spasm.turn_order.register_next_speaker`, ``@spasm.tool``,
:func:`spasm.export.register_format`, :func:`spasm.export.register_scan` and
:func:`spasm.evaluation.register_embedder`. A plugin never replaces a name silently: registering a
built-in name (the ``openai`` backend, the ``ecp`` projection ...) is refused unless the plugin
passes ``replace=True`` (then spasm warns on every run that loads it), and two plugins that
register the same name are refused whatever they pass. Every loaded plugin (entry point,
distribution, version, what it replaced) is recorded in the run's manifest
(:func:`plugin_records`). The plugins are loaded once per process, at the CLI's start,
when an :class:`~spasm.engine.Engine` is made, and on the first look-up of a name no built-in
has, from Python as from the CLI (so a config may name a plugin's backend kind, condition or
detector, and ``export_run``, ``evaluate`` and ``scan_text`` find a plugin's format, embedder
and scans: tests/test_plugins.py). A plugin that fails
to load is a :class:`~spasm.errors.UserError` naming its entry point and distribution (exit 2),
never a traceback from inside spasm.

A leaf: it imports nothing of spasm but :mod:`spasm.errors` (a plugin's own imports happen when
it is loaded).
"""

from __future__ import annotations

import functools
import threading
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

from spasm.errors import UserError

__all__ = ["GROUP", "PluginError", "installed_version", "load_plugins", "loaded_plugins",
           "loading_plugin", "plugin_records"]

#: The entry-point group spasm reads plugins from.
GROUP = "spasm.plugins"


class PluginError(UserError):
    """An installed plugin failed to load (its import or its registration raised)."""


@dataclass
class Plugin:
    """One entry point being loaded or loaded: what the manifest records of it."""

    name: str
    value: str
    distribution: str | None
    version: str | None
    #: What it replaced on purpose (``replace=True``), as "backend kind 'openai'".
    replaces: list[str] = field(default_factory=list)

    @property
    def owner(self) -> str:
        """Who owns the names it registers: its distribution (so the entry points of one
        distribution may share names), or the entry point when it has none."""
        return self.distribution or f"entry point {self.name!r}"

    @property
    def label(self) -> str:
        """The plugin as messages name it."""
        dist = f" (distribution {self.distribution})" if self.distribution else ""
        return f"spasm plugin {self.name!r} = {self.value!r}{dist}"

    def record(self) -> dict[str, Any]:
        return {"entry_point": self.name, "value": self.value, "distribution": self.distribution,
                "version": self.version, "replaces": list(self.replaces)}


_lock = threading.RLock()
#: Entry points loaded so far, by ``name = value`` (each is loaded once per process).
_loaded: dict[str, Plugin] = {}
_scanned = False
_loading = False
#: The plugin whose import or ``register()`` is running now (its registrations are its own).
_current: Plugin | None = None


def _where(exc: BaseException) -> str:
    """The innermost frame of a plugin's exception, as ``file:line``."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _load_one(ep: metadata.EntryPoint, plugin: Plugin) -> None:
    global _current
    name, what = plugin.distribution, plugin.label
    fix = f" Fix the plugin or uninstall it (pip uninstall {name})." if name else ""
    _current = plugin
    try:
        obj = ep.load()
        if not isinstance(obj, ModuleType):
            if not callable(obj):
                kind = type(obj).__name__
                raise PluginError(
                    f"{what} is neither a module nor a callable (it is {'an' if kind[0] in 'aeiou' else 'a'}"
                    f" {kind}): point the entry point at the module that registers, or at a function "
                    f"that does.{fix}")
            obj()
    except PluginError:
        raise
    except SystemExit as exc:  # sys.exit() at import: the plugin's, never spasm exiting with it
        raise PluginError(f"{what} called sys.exit({exc.code!r}) while loading{_where(exc)}: a "
                          f"plugin must not exit.{fix}") from None
    except Exception as exc:  # a plugin's bug is the plugin's: name it, not spasm's frames
        raise PluginError(f"{what} failed to load: {type(exc).__name__}: {exc}{_where(exc)}.{fix}"
                          ) from exc
    finally:
        _current = None


@functools.cache
def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (``None`` when it is not installed): what the
    manifest and ``spasm --version`` name. Looked up once per process, since each look-up scans
    every path entry's distributions (milliseconds, paid by every run's manifest otherwise)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _plugin(ep: metadata.EntryPoint) -> Plugin:
    dist = getattr(ep, "dist", None)
    name = dist.name if dist is not None and dist.name else None
    version = dist.version if dist is not None and name else None
    return Plugin(ep.name, ep.value, name, version)


def loading_plugin() -> Plugin | None:
    """The plugin being loaded now, or ``None`` (spasm's own registrations, a test's, a
    script's): the registries ask, to refuse a plugin that shadows a name silently."""
    return _current


def load_plugins(*, rescan: bool = False) -> list[str]:
    """Load every ``spasm.plugins`` entry point not loaded yet; returns the names loaded so
    far. Installed plugins are looked for once per process; ``rescan`` looks again (after a
    plugin was installed into a running process: tests). A look-up made by a plugin while it
    loads does not load the others again (no recursion)."""
    global _scanned, _loading
    with _lock:
        if _loading or (_scanned and not rescan):
            return sorted(p.name for p in _loaded.values())
        _loading = True
        try:
            for ep in sorted(metadata.entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
                key = f"{ep.name} = {ep.value}"
                if key in _loaded:
                    continue
                plugin = _plugin(ep)
                _load_one(ep, plugin)
                _loaded[key] = plugin
            _scanned = True  # only once every plugin loaded: a broken one fails each look-up
        finally:
            _loading = False
        return sorted(p.name for p in _loaded.values())


def loaded_plugins() -> list[str]:
    """The names of the plugins loaded so far (for messages)."""
    with _lock:
        return sorted(p.name for p in _loaded.values())


def plugin_records() -> list[dict[str, Any]]:
    """Every plugin loaded so far, as the manifest records it (entry point, value,
    distribution, version, what it replaced), sorted by entry point."""
    with _lock:
        return [p.record() for p in sorted(_loaded.values(), key=lambda p: (p.name, p.value))]

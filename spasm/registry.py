"""Named registries, one per extension kind: backends by kind, projections by condition,
termination detectors, next-speaker policies, tools, export formats, QA scans and embedders by
name (a leaf: imports only errors and the plugin loader).

A registry maps a name to an implementation that registers itself with a decorator
(``@BACKENDS.register("openai")``, or the kind's own ``register_*`` which calls it). The
built-in names a config may check are listed here with the module that implements them,
imported only when the implementation is first looked up: so the layers that only *check* a
name (the config) never import the layers that implement it, and importing this module stays
cheap. The kinds only their own module looks up (formats, scans, embedders) name that module
instead (``home``), imported before any look-up. Plugins register the same way, with the same decorators:
the first look-up of a name that is not known yet loads the installed plugins
(:func:`spasm.plugins.load_plugins`, once), so a config may name what a plugin registers.

A plugin never shadows a name silently: while a plugin loads, registering a name spasm
already has (a built-in, or one spasm's own modules registered) is refused unless the plugin
passes ``replace=True`` (then the built-in is imported first, the plugin's replaces it, and
spasm warns and records the replacement in the manifest), and a name another plugin
registered is refused whatever it passes. Registrations made outside a plugin (spasm's own,
a test's, a script's) replace the name's implementation (the last one registered wins).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

__all__ = [
    "BACKENDS",
    "BUILTIN_CONDITIONS",
    "DETECTORS",
    "EMBEDDERS",
    "FORMATS",
    "NEXT_SPEAKERS",
    "PROJECTIONS",
    "SCANS",
    "TOOLS",
    "Registry",
    "condition_rank",
    "ordered_conditions",
]

T = TypeVar("T")


class Registry(Generic[T]):
    """Names to implementations; ``builtins`` are modules that register on import, ``home`` the
    one module that registers every built-in of a kind."""

    def __init__(self, what: str, builtins: dict[str, str] | None = None, *,
                 home: str | None = None) -> None:
        self.what = what
        #: Built-in name → the module that registers it on import.
        self._builtins = dict(builtins or {})
        #: The module that registers this kind's built-ins, imported before any look-up.
        self._home = home
        self._entries: dict[str, T] = {}
        #: Name → the plugin (its distribution) that registered it; spasm's own are absent.
        self._owners: dict[str, str] = {}

    def register(self, name: str, *, replace: bool = False, source: object = None) -> Callable[[T], T]:
        """Register an implementation under ``name`` (a decorator); a later one replaces it,
        but a plugin replaces one of spasm's names only with ``replace=True`` and never
        another plugin's (see the module's docstring). ``source``: what tells whose the
        implementation is, when it is a record wrapping the plugin's function (an export
        format); default the implementation itself."""

        def decorate(impl: T) -> T:
            module = str(getattr(impl if source is None else source, "__module__", None) or "")
            if module != "spasm" and not module.startswith("spasm."):
                self._claim(name, replace)  # (spasm's own modules may load during a plugin's)
            self._entries[name] = impl
            return impl

        return decorate

    def _claim(self, name: str, replace: bool) -> None:
        """Refuse a plugin's silent shadowing of ``name``; note an explicit one."""
        from spasm.plugins import PluginError, loading_plugin

        plugin = loading_plugin()
        if plugin is None:
            return  # spasm's own registration, a test's or a script's: the last one wins
        self._import_home()  # the built-ins first, so a plugin cannot take their names
        owner = self._owners.get(name)
        if owner == plugin.owner:
            return  # the same distribution again (another of its entry points)
        if owner is not None:
            raise PluginError(
                f"{plugin.label} registers the {self.what} {name!r}, which the plugin {owner} "
                f"registered already: two plugins cannot share a name (the last loaded would win "
                f"silently). Uninstall one of them (pip uninstall {plugin.distribution or owner}), "
                "or rename the name in one.")
        if name in self._builtins or name in self._entries:
            if not replace:
                raise PluginError(
                    f"{plugin.label} registers the {self.what} {name!r}, which spasm already has: "
                    "a plugin does not replace a built-in silently. Register it under another "
                    "name, or pass replace=True to the register decorator if replacing it is the "
                    "point (spasm then warns on every run and records it in the manifest).")
            if name in self._builtins:
                importlib.import_module(self._builtins[name])  # its own first, then the plugin's
            plugin.replaces.append(f"{self.what} {name!r}")
            logging.getLogger("spasm").warning(
                "%s replaces spasm's %s %r (replace=True): runs use the plugin's, and the "
                "manifest records it.", plugin.label, self.what, name)
        self._owners[name] = plugin.owner

    def names(self) -> list[str]:
        """Every known name (built-in, registered or from a plugin), sorted; imports no
        built-in implementation (but the ``home`` module)."""
        self._import_home()
        _load_plugins()
        return sorted(set(self._builtins) | set(self._entries))

    def registered(self) -> list[tuple[str, T]]:
        """Every implementation with its name, in the order they were registered (the
        built-ins' modules imported and the installed plugins loaded first)."""
        self._import_home()
        _load_plugins()
        for module in dict.fromkeys(self._builtins.values()):
            importlib.import_module(module)
        return list(self._entries.items())

    def _import_home(self) -> None:
        if self._home is not None and self._home not in sys.modules:
            importlib.import_module(self._home)

    def _known(self, name: object) -> bool:
        self._import_home()
        return name in self._builtins or name in self._entries

    def __contains__(self, name: object) -> bool:
        if not self._known(name):
            _load_plugins()  # a name no built-in has may come from a plugin
        return self._known(name)

    def get(self, name: str) -> T | None:
        """The implementation registered under ``name`` (a built-in's module is imported on
        first look-up, the plugins on the first look-up of an unknown name), or ``None``."""
        if not self._known(name):
            _load_plugins()
        if name not in self._entries and name in self._builtins:
            importlib.import_module(self._builtins[name])
        return self._entries.get(name)

    def unregister(self, name: str) -> None:
        """Forget a registered ``name`` (tests and plugins that replace a built-in); a built-in
        name stays known."""
        self._entries.pop(name, None)
        self._owners.pop(name, None)


def _load_plugins() -> None:
    """Load the installed plugins once (a no-op after the first time)."""
    from spasm.plugins import load_plugins

    load_plugins()


#: Backend factories by config ``kind`` (:mod:`spasm.backends.registry` builds from them).
BACKENDS: Registry[Callable[..., object]] = Registry(
    "backend kind",
    {"openai": "spasm.backends.openai_compat", "embedded": "spasm.backends.embedded",
     "python": "spasm.backends.python", "human": "spasm.backends.human"},
)
#: Termination detector factories by name (:mod:`spasm.termination`): ``termination.rules``
#: and ``termination.judge`` switch the built-in ones on, ``termination.detectors`` names more.
DETECTORS: Registry[Callable[..., object]] = Registry(
    "termination detector", {"rules": "spasm.termination", "judge": "spasm.termination"}
)
#: The built-in conditions, in reporting order: every table, figure and list of conditions
#: puts ECP first, then CONCAT, then QUOTED (:func:`condition_rank`).
BUILTIN_CONDITIONS: tuple[str, ...] = ("ecp", "concat", "quoted")
#: Projections Ψ by condition name (:mod:`spasm.projection`).
PROJECTIONS: Registry[Callable[..., object]] = Registry(
    "projection", {name: "spasm.projection" for name in BUILTIN_CONDITIONS}
)


def condition_rank(condition: str) -> tuple[int, str]:
    """The sort key of a condition: the built-in ones in :data:`BUILTIN_CONDITIONS` order, then
    any other (a plugin's projection) by name. Every ordering of conditions uses it, so a plugin
    condition sorts the same in every table and figure (tests/test_plugins.py)."""
    known = BUILTIN_CONDITIONS.index(condition) if condition in BUILTIN_CONDITIONS else None
    return (len(BUILTIN_CONDITIONS) if known is None else known, condition)


def ordered_conditions(conditions: Iterable[str]) -> list[str]:
    """``conditions`` without repeats, in reporting order (:func:`condition_rank`)."""
    return sorted(set(conditions), key=condition_rank)


#: Next-speaker policies of group dialogues by name (:mod:`spasm.turn_order`): ``group.next_speaker``.
NEXT_SPEAKERS: Registry[Callable[..., object]] = Registry(
    "next-speaker policy",
    {name: "spasm.turn_order" for name in ("round_robin", "addressed", "random", "llm")},
)
#: Tools by name (:mod:`spasm.tools`): every ``@spasm.tool`` registers here when its module is
#: imported (a module the config's ``tools:`` names, or a plugin's).
TOOLS: Registry[object] = Registry("tool")
#: Export formats by name (:mod:`spasm.export.formats`, ``register_format``): ``spasm export
#: --format`` and ``export_run``; with no format named, every registered one.
FORMATS: Registry[Any] = Registry("export format", home="spasm.export.formats")
#: QA scans by the kind of finding they report (:mod:`spasm.export.scans`, ``register_scan``):
#: ``spasm qa``, ``scan_run`` and every export run each registered scan, in registration order.
SCANS: Registry[Callable[..., Any]] = Registry("QA scan", home="spasm.export.scans")
#: Embedder factories by name (:mod:`spasm.evaluation.embeddings`, ``register_embedder``):
#: ``spasm eval --embedder`` and ``evaluate(embedder=...)``.
EMBEDDERS: Registry[Callable[..., Any]] = Registry("embedder", home="spasm.evaluation.embeddings")

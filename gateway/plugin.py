"""The agent plugin: a Python module (``GATEWAY_PLUGIN``) that defines the agent the service runs.

A plugin module may define, all optional:

* ``tools() -> Sequence[Tool]``: the tools the agent can call (with their replay and approval
  declarations);
* ``model(settings) -> tuple[ModelClient, ModelRef] | None`` (or ``model()``): a model client of
  its own; None, or no ``model``, means the one ``GATEWAY_MODEL`` names;
* ``adapters(settings, clock) -> Sequence[ChannelAdapter]``: channels besides the built-in ones
  (a channel of the same name replaces the built-in one).

The module is found like ``python -m`` finds one: in the current directory first, then among the
installed packages, so ``GATEWAY_PLUGIN=agent`` loads ``./agent.py`` (``examples/agent.py`` is a
worked example). A value ending in ``.py`` is a file, relative to the current directory
(``GATEWAY_PLUGIN=examples/agent.py``): it is imported as the module its name says (``agent``)
with its directory first on the import path, as ``python examples/agent.py`` would run it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from adapters import ChannelAdapter
from config import Settings
from gateway.errors import GatewayError
from harness_core import Clock, ModelClient, ModelRef, Tool

__all__ = ["Plugin", "PluginError", "load_plugin"]


class PluginError(GatewayError, ValueError):
    """The plugin cannot be imported or does not define what it says (one clear line)."""

    @property
    def exit_status(self) -> int:
        """2, as every setting that cannot be used: fix the configuration, then start again."""
        return 2


@dataclass(frozen=True, kw_only=True, slots=True)
class Plugin:
    """What a plugin module provides."""

    name: str
    tools: Sequence[Tool] = ()
    model: tuple[ModelClient, ModelRef] | None = None
    adapters: Callable[[Settings, Clock], Sequence[ChannelAdapter]] | None = None


def load_plugin(name: str | None, settings: Settings | None = None) -> Plugin:
    """Import the plugin module `name` (None: no plugin), looking in the current directory first.

    `settings` are handed to a ``model(settings)`` that takes them (default: `Settings()`).

    Raises:
        PluginError: the module cannot be imported, or a function returns the wrong thing.
    """
    if name is None:
        return Plugin(name="")
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)  # what `python -m` and uvicorn do: ./agent.py is `agent`
    try:
        module = (
            _from_file(name, Path(here)) if name.endswith(".py") else importlib.import_module(name)
        )
    except PluginError:
        raise
    except SystemExit as exc:  # the command exited with its status and not a word
        raise PluginError(
            f"GATEWAY_PLUGIN={name}: it exits while it is imported (sys.exit({exc.code!r}))"
        ) from None
    except Exception as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing is not None and f"{name}.".startswith(f"{missing}."):  # not its imports
            raise PluginError(
                f"GATEWAY_PLUGIN={name}: no module {missing!r} in {here} or the installed "
                "packages (name a module like agent for ./agent.py or pkg.agent, or a file "
                "like examples/agent.py)"
            ) from exc
        raise PluginError(
            f"GATEWAY_PLUGIN={name}: cannot import it ({type(exc).__name__}: {exc})"
        ) from exc
    hooks = ("tools", "model", "adapters")
    if not any(callable(getattr(module, hook, None)) for hook in hooks):
        # `GATEWAY_PLUGIN=os` (a typo, a module of the same name) ran as no plugin at all
        where = getattr(module, "__file__", None) or "a directory without __init__.py"
        raise PluginError(
            f"GATEWAY_PLUGIN={name}: {where} defines none of tools(), model() or adapters(): "
            "is it the agent's module?"
        )
    tools = _call(module, name, "tools", ())
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
        raise PluginError(
            f"GATEWAY_PLUGIN={name}: tools() must return a list of Tool objects, not "
            f"{type(tools).__name__}"
        )
    tools = list(tools)
    if not all(isinstance(tool, Tool) for tool in tools):
        raise PluginError(f"GATEWAY_PLUGIN={name}: tools() must return Tool objects")
    named = Counter(tool.name for tool in tools)
    if twice := sorted(n for n, count in named.items() if count > 1):
        # the last one ran, and the model was offered both: a provider that refuses two
        # definitions of one name would fail every request (an outside probe)
        raise PluginError(
            f"GATEWAY_PLUGIN={name}: tools() names {', '.join(map(repr, twice))} more than "
            "once: each tool needs a name of its own"
        )
    for tool in tools:
        # every model request lists it: a schema that cannot be written (a NaN default) failed
        # each request of every thread offered it, three times, then parked the lane stuck
        try:
            tool.definition()
        except Exception as exc:
            said = " ".join(str(exc).split())[:300]
            if isinstance(exc, ValidationError) and exc.errors():
                said = str(exc.errors(include_input=False, include_url=False)[0]["msg"])[:300]
            raise PluginError(
                f"GATEWAY_PLUGIN={name}: tool {tool.name!r} cannot be offered to a model: its "
                f"arguments' schema is refused ({type(exc).__name__}: {said})"
            ) from None
    model = _call(module, name, "model", None, settings if settings is not None else Settings())
    if model is not None and not (
        isinstance(model, tuple) and len(model) == 2 and isinstance(model[1], ModelRef)
    ):
        raise PluginError(f"GATEWAY_PLUGIN={name}: model() must return (client, ModelRef) or None")
    adapters = getattr(module, "adapters", None)
    return Plugin(name=name, tools=tuple(tools), model=model, adapters=adapters)


def _from_file(name: str, here: Path) -> ModuleType:
    """The module a ``.py`` file holds, imported under its file's name (once per file)."""
    path = (here / Path(name).expanduser()).resolve()
    if not path.is_file():
        raise PluginError(
            f"GATEWAY_PLUGIN={name}: no file {path} (a path is relative to {here}; or name "
            "a module like agent for ./agent.py or pkg.agent)"
        )
    module_name = path.stem
    if not module_name.isidentifier():
        raise PluginError(
            f"GATEWAY_PLUGIN={name}: {path.name} cannot be imported (a module's file name "
            "is letters, digits and _, not starting with a digit): rename it"
        )
    loaded = sys.modules.get(module_name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise PluginError(
            f"GATEWAY_PLUGIN={name}: a module named {module_name!r} is imported already "
            f"(from {getattr(loaded, '__file__', None) or 'built in'}): rename {path.name}"
        )
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # its neighbours import as they would for `python <file>`
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:  # not for a .py file; a defect if it happens
        raise PluginError(f"GATEWAY_PLUGIN={name}: Python cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # pydantic models resolve their annotations through it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _call(module: Any, name: str, function: str, default: Any, *given: Any) -> Any:
    """Call `module.function`, with `given` if it takes parameters (``model(settings)``)."""
    made = getattr(module, function, None)
    if made is None:
        return default
    try:
        takes = len(inspect.signature(made).parameters)
    except (TypeError, ValueError):
        takes = 0
    try:
        return made(*given[:takes])
    except Exception as exc:
        raise PluginError(
            f"GATEWAY_PLUGIN={name}: {function}() failed ({type(exc).__name__}: {exc})"
        ) from exc

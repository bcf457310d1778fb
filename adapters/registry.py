"""The channel registry: the built-in channels, one line each, and those installed packages add.

Adding a channel is a folder with a ``spec`` module holding ``SPEC`` (a `ChannelSpec`) and one
line in `BUILT_IN`; a channel shipped as its own package instead declares an entry point in
the ``durable_gateway.channels`` group (``name = "package.module:SPEC"``). Loading a spec
imports only its settings and its builder's signature, never the channel's libraries.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from adapters.errors import AdapterError
from adapters.kit import ChannelSpec
from config.sections import Section

__all__ = ["BUILT_IN", "ENTRY_POINT_GROUP", "RegistryError", "channel_sections", "channel_specs"]

BUILT_IN = (
    "adapters.web.spec:SPEC",
    "adapters.slack.spec:SPEC",
    "adapters.email.spec:SPEC",
    "adapters.webhook.spec:SPEC",
)
"""The built-in channels, in the order the service starts them."""

ENTRY_POINT_GROUP = "durable_gateway.channels"

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


class RegistryError(AdapterError):
    """A channel spec cannot be loaded, or two specs claim one name (`str()` says which)."""


def channel_specs() -> tuple[ChannelSpec[Any], ...]:
    """Every registered channel: the built-in ones, then installed ones by name.

    Raises:
        RegistryError: a spec cannot be imported, is not a `ChannelSpec`, has a name that is
            not 1-32 of a-z and 0-9 starting with a letter, or repeats another's name.
    """
    found: list[ChannelSpec[Any]] = [_load(target, "built in") for target in BUILT_IN]
    plugged = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda point: point.name)
    found += [_load(point.value, f"entry point {point.name!r}") for point in plugged]
    seen: set[str] = set()
    for spec in found:
        if spec.name in seen:
            raise RegistryError(f"two channels are named {spec.name!r}: keep one")
        seen.add(spec.name)
    return tuple(found)


def channel_sections(specs: tuple[ChannelSpec[Any], ...]) -> Mapping[str, type[Section]]:
    """The settings sections of `specs`, by channel name (what `load_settings` reads)."""
    return {spec.name: spec.section for spec in specs}


def _load(target: str, origin: str) -> ChannelSpec[Any]:
    module_name, _, attribute = target.partition(":")
    try:
        spec = getattr(importlib.import_module(module_name), attribute or "SPEC")
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"channel {target} ({origin}) cannot be loaded: {exc}") from None
    if not isinstance(spec, ChannelSpec):
        raise RegistryError(f"channel {target} ({origin}) is not a ChannelSpec")
    name = spec.name
    if not (1 <= len(name) <= 32 and name[0].isalpha() and set(name) <= _NAME_CHARS):
        raise RegistryError(
            f"channel {target} ({origin}) is named {name!r}: expected 1-32 of a-z and 0-9, "
            "from a letter"
        )
    if not issubclass(spec.section, Section):
        raise RegistryError(f"channel {target} ({origin}): its section is not a Section")
    return spec

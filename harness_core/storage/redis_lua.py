"""The Lua scripts of the Redis Streams backend (``lua/*.lua``); a group commit is one call.

Every script gets the session's ``meta`` key as KEYS[1] and derives the session's other keys
from it: they all share the ``{session}`` hash tag, so they live in one Redis Cluster slot.
Errors come back as ``GW <code> <message>`` and are mapped to `SessionError` codes.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["SCRIPTS"]

_NAMES = (
    "create",
    "mutate",
    "acquire",
    "check_lease",
    "renew",
    "release",
    "delete",
    "walk",
    "read_entries",
    "lane_slice",
    "records_page",
    "upgrade",
)


def _load() -> dict[str, str]:
    folder = resources.files("harness_core.storage").joinpath("lua")
    prelude = folder.joinpath("prelude.lua").read_text()
    return {name: prelude + folder.joinpath(f"{name}.lua").read_text() for name in _NAMES}


SCRIPTS: dict[str, str] = _load()
"""Script name -> full Lua source (the shared prelude, then the script)."""

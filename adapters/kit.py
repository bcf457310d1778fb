"""The channel kit: what a channel folder declares so the service can run it without knowing it.

A channel is a folder under ``adapters/`` (or a package of its own) whose ``spec`` module holds a
`ChannelSpec`: its name, its settings `Section` (read from ``[<name>]`` and
``GATEWAY_<NAME>_*``), whether a deployment's section turns it on, how to build the adapter
from the section and the service's `ChannelContext`, and what `gateway serve` says about it.
The adapter it builds keeps the `ChannelAdapter` contract (its HTTP routes are its `router`)
and passes the shipped suite (`adapters.conformance`). ``adapters/registry.py`` lists the
built-in specs; an installed package adds one through the ``durable_gateway.channels`` entry
point group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pydantic import SecretStr

from adapters.channel import ChannelAdapter
from config.sections import Section
from harness_core.backends.urls import userinfo_password
from harness_core.clock import Clock

__all__ = ["ChannelContext", "ChannelSpec"]

S = TypeVar("S", bound=Section)


@dataclass(frozen=True)
class ChannelContext:
    """What the service gives every channel it builds (the same for all of them)."""

    clock: Clock
    call_timeout_s: float
    """How long one call to the channel (a post, a reconcile) may take (the deliverer's
    `delivery_timeout_seconds`): past it the outcome is unknown and reconciled."""
    shared_url: str | None = None
    """The deployment's Redis (``redis_url``), which a channel keeping state of its own uses
    unless its section names another place."""
    public_url: str | None = None
    """The gateway's base URL as people reach it (for links a channel sends), if configured."""
    base_url: str = "http://127.0.0.1:8787"
    """Where this process serves HTTP (for what `gateway serve` prints)."""
    spaces: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The spaces the deployment's routes name, by channel, in their order (``*`` left out):
    what `gateway serve` points a person to first."""


@dataclass(frozen=True)
class ChannelSpec(Generic[S]):
    """A channel as the service sees it: a name, a settings section, a builder.

    `build` imports the channel's heavy modules itself, so reading the settings of a
    deployment never imports a channel it does not run.
    """

    name: str
    """The channel's name: ``ThreadRef.channel`` of its threads, its routes' ``channel``, its
    settings section (``[<name>]``, ``GATEWAY_<NAME>_*``)."""
    section: type[S]
    """Its settings: every field has a default (an unconfigured channel is off, or on with
    its defaults)."""
    enabled: Callable[[S], bool]
    """Whether a deployment with this section runs the channel."""
    build: Callable[[S, ChannelContext], ChannelAdapter]
    """The adapter, not yet started (the service starts, stops and closes it)."""
    describe: Callable[[S, ChannelContext], Sequence[str]] = field(default=lambda s, c: ())
    """Lines `gateway serve` prints about the running channel (how to reach it)."""
    state_url: Callable[[S, ChannelContext], str | None] = field(default=lambda s, c: None)
    """Where the channel keeps state of its own (a URL), if anywhere: the service warns when
    it is a local file while the broker is shared."""
    serves: Callable[[S, str], bool] = field(default=lambda s, space: True)
    """Whether the running channel still speaks in threads of a space (email: only its own
    address; a thread of a mailbox the settings no longer name has lost its authority, D268)."""

    def secrets(self, section: S) -> Iterator[str]:
        """The section's secrets (`SecretStr` fields, URL passwords): the redactor hides them.

        A tuple of `SecretStr` (tokens) gives each one whole and, for a ``name:secret`` token,
        its secret alone too (what a client sends).
        """
        for name in type(section).model_fields:
            value = getattr(section, name)
            if isinstance(value, SecretStr) and value.get_secret_value():
                yield value.get_secret_value()
            elif isinstance(value, tuple):
                for item in value:
                    if isinstance(item, SecretStr) and item.get_secret_value():
                        whole = item.get_secret_value()
                        yield whole
                        if ":" in whole:
                            yield whole.partition(":")[2]
            elif isinstance(value, str) and (password := userinfo_password(value)):
                yield password  # read up to the last "@": an unencoded "#" or "@" too

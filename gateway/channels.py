"""The channels a deployment runs: the registry's specs, read and built from the settings.

The service knows no channel by name: it reads every registered channel's section
(`load_gateway_settings`, with the one section that is no channel: ``[mcp]``, the MCP servers),
builds the adapters whose sections turn them on
(`build_channels`), and asks the specs what to print, which secrets to hide and where the
channels keep state of their own.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from adapters import (
    ChannelAdapter,
    ChannelContext,
    ChannelSpec,
    RegistryError,
    ThreadRef,
    channel_sections,
    channel_specs,
)
from config import Settings, SettingsError, load_settings
from config.loader import settings_from
from config.sections import Section
from config.settings import accepted
from gateway.broker import BrokerError, check_broker_url
from gateway.mcp.settings import SECTION as MCP_SECTION
from gateway.mcp.settings import McpSection
from harness_core.backends.urls import RedisUrls, shown
from harness_core.clock import Clock
from harness_core.errors import SessionError
from harness_core.storage import check_repo_url

__all__ = [
    "bindings_judge",
    "build_channels",
    "channel_lines",
    "channel_secrets",
    "channel_state",
    "context_for",
    "enabled_specs",
    "gateway_sections",
    "gateway_settings",
    "load_gateway_settings",
    "served_url",
    "specs",
]


@functools.cache
def specs() -> tuple[ChannelSpec[Any], ...]:
    """Every registered channel (built in, then installed), loaded once per process."""
    return channel_specs()


def gateway_sections() -> Mapping[str, type[Section]]:
    """Every settings section a deployment reads: each channel's, then ``[mcp]`` (the servers).

    Raises:
        RegistryError: a channel is named ``mcp`` (the section would be ambiguous).
    """
    sections = dict(channel_sections(specs()))
    if MCP_SECTION in sections:
        raise RegistryError(f"a channel is named {MCP_SECTION!r}, the MCP servers' section")
    sections[MCP_SECTION] = McpSection
    return sections


def load_gateway_settings(
    environ: Mapping[str, str] | None = None,
    *,
    config_file: str | os.PathLike[str] | None = None,
    env_file: str | os.PathLike[str] | None = None,
) -> Settings:
    """`config.load_settings` with every section of `gateway_sections` (same errors).

    Every route must name a channel this gateway has (`SettingsError` otherwise).
    """
    return _routed(
        load_settings(
            environ,
            config_file=config_file,
            env_file=env_file,
            sections=gateway_sections(),
            checks=_URL_CHECKS,
        )
    )


def gateway_settings(**values: Any) -> Settings:
    """`Settings` by setting name, every section included (``slack_bot_token=...``).

    Raises:
        SettingsError: a name is no setting, or a value is refused (``str()`` is one line).
    """
    return _routed(settings_from(values, sections=gateway_sections(), checks=_URL_CHECKS))


def _store_url(url: str) -> None:
    try:
        check_repo_url(url)
    except SessionError as exc:
        raise ValueError(str(exc)) from None


def _broker_url(url: str) -> None:
    try:
        check_broker_url(url)
    except BrokerError as exc:
        raise ValueError(str(exc)) from None


def _redis_url(url: str) -> None:
    def refuse(url: str, why: str | None) -> ValueError:
        return ValueError(f"{shown(url)}: {why}; expected {accepted('redis_url')}")

    RedisUrls(default_prefix="gw").parse(url, refuse)  # the store's and the broker's form


_URL_CHECKS = {"store_url": _store_url, "broker_url": _broker_url, "redis_url": _redis_url}
"""The backends' URL forms, checked as settings: a bad URL is said naming the setting and where
it was set (a bad ``GATEWAY_REDIS_URL`` was said as a "store URL" only, an outside probe)."""


ASK_CHANNEL = "cli"
"""The channel of `gateway ask`'s lanes (``cli:NAME``), which routes may name too."""


def _routed(settings: Settings) -> Settings:
    """`settings`, once each route names a channel of the registry (a typo bound nothing).

    Raises:
        SettingsError: a route names no channel (one line, with the channels there are).
    """
    known = [spec.name for spec in specs()] + [ASK_CHANNEL]  # `gateway ask`'s lanes (D390)
    for index, route in enumerate(settings.routes):
        if route.channel not in known:
            near = difflib.get_close_matches(route.channel, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise SettingsError(
                [
                    f"routes[{index}] names the channel {route.channel!r}, which this gateway "
                    f"does not have ({hint}its channels: {', '.join(known)})"
                ]
            )
    return settings


def context_for(settings: Settings, clock: Clock) -> ChannelContext:
    """What every channel of this deployment is built with."""
    return ChannelContext(
        clock=clock,
        call_timeout_s=settings.delivery_timeout_seconds,
        shared_url=settings.redis_url,
        public_url=settings.public_url,
        base_url=served_url(settings),
        spaces=_spaces(settings),
    )


def _spaces(settings: Settings) -> dict[str, tuple[str, ...]]:
    found: dict[str, list[str]] = {}
    for route in settings.routes:
        named = found.setdefault(route.channel, [])
        if route.space != "*" and route.space not in named:
            named.append(route.space)
    return {channel: tuple(spaces) for channel, spaces in found.items()}


def served_url(settings: Settings, host: str | None = None) -> str:
    """The service's URL from its host (or `host`) and port (an IPv6 address in brackets)."""
    host = settings.host if host is None else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def enabled_specs(settings: Settings) -> list[tuple[ChannelSpec[Any], Section]]:
    """The channels this deployment runs, each with its section, in registry order."""
    found: list[tuple[ChannelSpec[Any], Section]] = []
    for spec in specs():
        section = settings.section(spec.name, spec.section)
        if spec.enabled(section):
            found.append((spec, section))
    return found


def build_channels(settings: Settings, clock: Clock) -> list[ChannelAdapter]:
    """The adapters of the channels this deployment runs (not started)."""
    context = context_for(settings, clock)
    return [spec.build(section, context) for spec, section in enabled_specs(settings)]


def channel_lines(settings: Settings, clock: Clock) -> list[str]:
    """What `gateway serve` prints about each running channel."""
    context = context_for(settings, clock)
    return [
        line
        for spec, section in enabled_specs(settings)
        for line in spec.describe(section, context)
    ]


def channel_state(settings: Settings, clock: Clock) -> dict[str, str]:
    """Where running channels keep state of their own (``<name> channel`` -> URL)."""
    context = context_for(settings, clock)
    return {
        f"{spec.name} channel": url
        for spec, section in enabled_specs(settings)
        if (url := spec.state_url(section, context)) is not None
    }


def bindings_judge(
    settings: Settings, running: Iterable[str]
) -> Callable[[str, ThreadRef], tuple[bool, str] | None]:
    """How the settings bind a thread to its session now (`gateway.authority.judge_bindings`).

    A thread of a channel in `running` (the adapters this process runs) is bound when its
    channel still serves its space (`ChannelSpec.serves`: email, its own mailbox) and the
    routes still send that space to its session. A thread of any other channel is not judged:
    it may run in another process, or be off for a while (D268).
    """
    known = {spec.name: spec for spec in specs()}
    serving = set(running)

    def judge(session: str, thread: ThreadRef) -> tuple[bool, str] | None:
        if thread.channel not in serving:
            return None
        spec = known.get(thread.channel)
        section = settings.section(spec.name, spec.section) if spec is not None else None
        # an adapter the settings did not build (a plugin's, a test's) has its own spaces
        if spec is not None and spec.enabled(section) and not spec.serves(section, thread.space):
            return False, (
                f"the {thread.channel} channel no longer serves {thread.space} "
                "(the settings name another)"
            )
        routed = settings.route_for(thread.channel, thread.space)
        if routed != session:
            return False, (
                f"the routes send {thread.channel} {thread.space} to session {routed} now, "
                f"not to {session}"
            )
        return True, ""

    return judge


def channel_secrets(settings: Settings) -> list[str]:
    """Every secret of every channel's section, running or not (for the redactor)."""
    return [
        secret
        for spec in specs()
        for secret in spec.secrets(settings.section(spec.name, spec.section))
    ]

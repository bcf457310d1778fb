"""The service's settings: one frozen model, the checks between its fields, and routing.

`load_settings` (``config/loader.py``) reads them from ``GATEWAY_*`` variables, a ``.env`` file
and a TOML file. Building ``Settings(...)`` directly reads nothing (tests do that) and applies the
same checks, so every `Settings` the service holds is consistent.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from config.fields import (
    Relation,
    Relations,
    accepted_in,
    check_http_url,
    check_tokens,
    check_url,
    comma_separated,
    default_text_in,
    is_host,
    is_loopback,
    scheme,
    token_text,
)
from config.profiles import (
    DEFAULT_PROFILE,
    MAX_INSTRUCTIONS,
    MAX_TOKEN_BUDGET,
    MODEL_NAME,
    BusyPolicy,
    Profile,
)
from config.sections import Section

__all__ = [
    "BusyPolicy",
    "Profile",
    "DEFAULT_BROKER_URL",
    "DEFAULT_STORE_URL",
    "LogLevel",
    "Route",
    "SESSION_ID_RULE",
    "Settings",
    "accepted",
    "default_session",
    "is_loopback",
    "is_session_id",
]


LogLevel = Literal["debug", "info", "warning", "error"]

DEFAULT_STORE_URL = "sqlite:///.gateway/gateway.db"
DEFAULT_BROKER_URL = "sqlite:///.gateway/broker.db"

# The store's session id rule (decision D16, harness_core.session.names.check_session_id),
# repeated here because config imports nothing of ours; a test keeps the two in step.
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}")
_SESSION_ID_CHAR = re.compile(r"[^A-Za-z0-9._:@+=-]")
SESSION_ID_RULE = (
    "1-200 of ASCII letters, digits and . _ : @ + = -, starting with a letter or digit"
)
_CHANNEL = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_SPACE = re.compile(r"[^\s\x00-\x1f\x7f]{1,256}")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
"""A Python module's dotted name (what ``import`` takes)."""
S = TypeVar("S", bound=Section)

_REDIS_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster")
_STORE_SCHEMES = ("sqlite", *_REDIS_SCHEMES, "jsonl", "memory")
_BROKER_SCHEMES = ("sqlite", *_REDIS_SCHEMES)
_LOCAL_SCHEMES = ("sqlite", "jsonl")


def is_session_id(text: str) -> bool:
    """Whether `text` is a valid session id (the store's rule D16)."""
    return _SESSION_ID.fullmatch(text) is not None


def default_session(channel: str, space: str) -> str:
    """The session of a space no route names: ``<channel>-<space>``, made a valid session id.

    Characters a session id cannot hold become ``-``; when that changed anything (or the name
    is too long) a hash of the original is appended, so two different spaces never share a
    session by accident (``web:a b`` and ``web:a-b`` stay apart).
    """
    raw = f"{channel}-{space}"
    clean = _SESSION_ID_CHAR.sub("-", raw)
    if not clean[:1].isascii() or not clean[:1].isalnum():
        clean = "s" + clean
    if clean == raw and is_session_id(clean):
        return clean
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{clean[: 200 - 13]}-{digest}"


class Route(BaseModel):
    """Threads of a channel's space go to a session (several spaces may share one session)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    channel: str = Field(description="web, slack, email...")
    space: str = Field(
        default="*", description="A web space, a Slack channel id, an email address; * for all."
    )
    session: str = Field(description="The session the threads become lanes of.")
    profile: str | None = Field(
        default=None, description="The agent profile of its threads (default: the default one)."
    )

    @field_validator("channel")
    @classmethod
    def _channel(cls, value: str) -> str:
        if not _CHANNEL.fullmatch(value):
            raise ValueError("expected a channel name: 1-32 of a-z, 0-9, _ and -, from a letter")
        return value

    @field_validator("space")
    @classmethod
    def _space(cls, value: str) -> str:
        if not _SPACE.fullmatch(value):
            raise ValueError("expected a space: 1-256 characters, no spaces or controls; * for all")
        return value

    @field_validator("session")
    @classmethod
    def _session(cls, value: str) -> str:
        if not is_session_id(value):
            raise ValueError(f"expected a session id: {SESSION_ID_RULE}")
        return value

    def matches(self, channel: str, space: str) -> bool:
        """Whether this route takes threads of `space` in `channel`."""
        return self.channel == channel and self.space in ("*", space)


class Settings(BaseModel):
    """Everything the gateway reads from its environment, checked as a whole.

    Fields are checked one by one (bounds, URL schemes, routes) and then together: a lease
    survives one failed renewal (3 x renew_seconds < lease_seconds) and a linger (3 x
    linger_seconds <= lease_seconds), the drain fits the shutdown (drain_seconds <
    shutdown_seconds) and a delivery attempt with its reconciliation fits the outbox lease
    (2 x delivery_timeout_seconds < outbox_lease_seconds). `warnings()` lists what is allowed
    but worth a line in the log.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    store_url: str = Field(
        default=DEFAULT_STORE_URL,
        description="Where sessions live: sqlite:///file.db (embedded default), "
        "redis://host:port/db (distributed), jsonl:///dir or memory:// "
        "(default: redis_url when that is set).",
    )
    model: str = Field(
        default="scripted:echo",
        min_length=1,
        description="The model, as provider:model_id: openai:gpt-4.1-mini, "
        "openai-responses:gpt-6.1-sol (the Responses API), anthropic:claude-sonnet-5-5, "
        "openai-compatible:<model> (with model_base_url: vLLM, Ollama, OpenRouter...), "
        "or scripted:echo (no key needed: repeats the message back).",
    )
    instructions: str | None = Field(
        default=None,
        max_length=MAX_INSTRUCTIONS,
        description="The agent's instructions (its system prompt) where no profile gives its "
        "own; the gateway adds where the agent is (channel, space, thread) after them.",
    )
    model_api_key: SecretStr | None = Field(
        default=None, description="The provider's API key (never logged or stored)."
    )
    model_base_url: str | None = Field(
        default=None, description="Base URL of an OpenAI-compatible or proxy endpoint."
    )
    model_max_output_tokens: int | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="Cap on a model answer's tokens (default: the model's).",
    )
    model_context_window: int | None = Field(
        default=None,
        ge=1024,
        le=100_000_000,
        description="How many tokens the model takes in, its context window (default: the "
        "window genai-prices knows for an openai: or anthropic: model, else 128000). Set it "
        "for a server with a smaller one (vLLM, Ollama), so that threads compact before "
        "they overflow.",
    )
    model_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        le=3600,
        description="How long one model request may wait for the provider (for its answer, or "
        "between two streamed chunks) before it fails as timed out; a timed-out request is "
        "retried like other transient failures.",
    )
    redis_url: str | None = Field(
        default=None,
        description="A Redis server (redis://host:port/db, rediss:// for TLS): store and broker "
        "both live there unless store_url/broker_url say otherwise; several `gateway serve` "
        "processes share it.",
    )
    broker_url: str | None = Field(
        default=None,
        description="Where the inbox, outbox and audit trail live: sqlite:///file.db or "
        f"redis://... (default: redis_url, else {DEFAULT_BROKER_URL}).",
    )
    host: str = Field(default="127.0.0.1", description="The HTTP server's address.")
    port: int = Field(default=8787, ge=1, le=65535, description="The HTTP server's port.")
    profiles: tuple[Profile, ...] = Field(
        default=(),
        description="Agent profiles (instructions, model, tools, approvers, busy_policy, "
        "max_attempts) that routes name; the one named default (if any) serves threads whose "
        "route names none, and a field a profile leaves unset is the top-level setting's.",
    )
    routes: tuple[Route, ...] = Field(
        default=(),
        description="Channel -> session bindings, first match wins, space * matches any space; "
        "a thread whose space no route names goes to the session `<channel>-<space>`.",
    )
    busy_policy: BusyPolicy = Field(
        default="steer",
        description="What a message does to a lane that is busy: steer the running operation "
        "(seen at its next checkpoint), follow_up (taken when it would stop) or next_run.",
    )
    worker_slots: int = Field(
        default=4, ge=1, le=128, description="Sessions one process works on at once."
    )
    lease_seconds: float = Field(
        default=30.0, ge=3, le=300, description="A session's writer lease (takeover after it)."
    )
    renew_seconds: float = Field(
        default=5.0,
        gt=0,
        le=100,
        description="How often a working session's lease is renewed (3 x this < lease_seconds).",
    )
    linger_seconds: float = Field(
        default=5.0,
        ge=0,
        le=100,
        description="How long a worker keeps a session it just served (its restored lanes, "
        "lease and ticket) for the session's next message, which then needs no take; it is let "
        "go sooner when that message finds no free slot here, another worker took the session "
        "over, 64 per slot linger already (the longest goes) or the process stops; 0: let go "
        "at once. At most a third of lease_seconds: a value set must keep 3 x this <= "
        "lease_seconds, the default is cut to it.",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=20,
        description="Interrupted executions of one operation before its lane is parked stuck.",
    )
    max_turns: int = Field(
        default=40,
        ge=1,
        le=1000,
        description="Model turns (a model step and its tool calls) a run may take for one "
        "message; then it stops, turn_limit, instead of asking the model again (a model calling "
        "tools in a loop would run on, and bill, until stopped).",
    )
    token_budget: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKEN_BUDGET,
        description="Tokens one thread may spend in all (its ledger: every model request's, "
        "failed attempts and summaries included); once spent, its runs stop, token_budget, "
        "before asking the model again, and the thread is told (default: no budget).",
    )
    drain_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="On SIGTERM: how long running steps get to reach a checkpoint "
        "(< shutdown_seconds).",
    )
    shutdown_seconds: float = Field(
        default=15.0,
        gt=0,
        le=600,
        description="On SIGTERM: the longest the process takes to stop, drain included.",
    )
    inbox_dedupe_seconds: float = Field(
        default=86_400.0,
        ge=60,
        le=2_592_000,
        description="How long a message id is remembered (dedupe).",
    )
    file_max_mb: float = Field(
        default=10.0,
        gt=0,
        le=100,
        description="The largest file a message brings in (MB); larger ones are refused.",
    )
    files_per_message: int = Field(
        default=10,
        ge=0,
        le=100,
        description="Files read per message; the rest are refused, with a reply.",
    )
    files_per_message_mb: float = Field(
        default=25.0,
        gt=0,
        le=500,
        description="What a message's files may bring in together (MB).",
    )
    file_text_chars: int = Field(
        default=100_000,
        ge=1_000,
        le=2_000_000,
        description="Characters of one text file or PDF the agent gets (the rest is cut).",
    )
    file_pdf_pages: int = Field(
        default=50, ge=1, le=2_000, description="Pages of one PDF the agent gets."
    )
    image_max_mb: float = Field(
        default=3.75,
        gt=0,
        le=100,
        description="The largest image sent to the model (MB); larger ones are refused, with "
        "a reply (Anthropic's API takes 3.75 MB: 5 MiB of base64).",
    )
    image_max_side: int = Field(
        default=8_000,
        ge=100,
        le=100_000,
        description="The most pixels an image sent to the model may have on a side.",
    )
    files_per_session_mb: float = Field(
        default=250.0,
        gt=0,
        le=100_000,
        description="What one session's files may hold in the broker's blob area (MB).",
    )
    file_retention_days: float = Field(
        default=7.0,
        gt=0,
        le=365,
        description="How long a file's content is kept after it arrived.",
    )
    delivery_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="How long one call to a channel (a post, a reconcile) may take before its "
        "outcome is unknown (2 x this < outbox_lease_seconds).",
    )
    outbox_max_attempts: int = Field(
        default=12, ge=1, le=100, description="Delivery attempts before a dead letter."
    )
    outbox_lease_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="How long one delivery attempt may take."
    )
    outbox_max_delay_seconds: float = Field(
        default=3600.0,
        ge=1,
        le=86_400,
        description="The longest wait between delivery attempts.",
    )
    approval_remind_seconds: float = Field(
        default=3600.0,
        ge=0,
        le=2_592_000,
        description="How long an approval request waits before it is asked again in its thread "
        "(then after twice that, four times...); 0: never.",
    )
    log_level: LogLevel = Field(default="info", description="The least severe log lines written.")
    provider_spans: bool = Field(
        default=False,
        description="With OpenTelemetry export on: also export pydantic-ai's span of each "
        "provider request (no message content), nested under the runtime's model request span.",
    )
    gc_young_threshold: int = Field(
        default=5_000,
        ge=0,
        le=10_000_000,
        description="Allocations between two collections of Python's youngest generation "
        "(Python's own default is 700); the service also freezes what its start built. "
        "0 leaves the collector as Python set it.",
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        default="auto",
        description="The event loop `gateway serve` runs on: auto (uvloop when it is installed, "
        "as it is with the gateway on Linux and macOS; asyncio's own loop otherwise), uvloop "
        "(refuse to start without it) or asyncio.",
    )
    plugin: str | None = Field(
        default=None,
        description="The Python module or file that defines the agent: tools() -> the tools, "
        "and optionally model() -> (client, model) and adapters(settings, clock) -> extra "
        "channels.",
    )

    public_url: str | None = Field(
        default=None,
        description="The gateway's base URL as approvers reach it (for links in email), like "
        "https://gateway.example.com.",
    )
    allowed_hosts: tuple[str, ...] = Field(
        default=(),
        description="Host names the HTTP server answers to besides localhost, 127.0.0.1, [::1], "
        "any address literal and public_url's host (comma-separated): a request naming another "
        "host is refused 421, so a web page whose name was rebound to this machine cannot drive "
        "the gateway (DNS rebinding).",
    )
    ops_tokens: tuple[SecretStr, ...] = Field(
        default=(),
        description="Bearer tokens of the operator API and the /ops page, comma-separated, each "
        "name:role:secret with role operator (may act) or viewer (reads only) and a secret of "
        "24+ characters; the name is who the audit trail says acted. With none, `gateway serve` "
        "on a loopback address makes an operator token at first start (.gateway/ops-token) and "
        "prints a sign-in link; binding beyond loopback needs tokens.",
        json_schema_extra={
            "accepts": "name:role:secret tokens, comma-separated",
            "default_text": "none: on loopback, a local token made at first start",
        },
    )
    channels: dict[str, Section] = Field(
        default_factory=dict,
        description="Each channel's settings section by the channel's name ([slack], [email], "
        "[web]...); a channel without one has its section's defaults.",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1; a TOML `worker_slots = true` is a mistake, not one slot.
        name = info.field_name
        if (
            isinstance(value, bool)
            and name is not None
            and cls.model_fields[name].annotation is not bool
        ):
            raise ValueError(f"expected {accepted(name)}, not true or false")
        return value

    @field_validator("plugin")
    @classmethod
    def _plugin(cls, value: str | None) -> str | None:
        if value is None or _MODULE.fullmatch(value):
            return value
        if value.endswith(".py") and len(value) <= 4096 and value.isprintable():
            return value  # a file: `load_plugin` says if it is not there
        raise ValueError(f"expected {accepted('plugin')}")

    @field_validator("store_url")
    @classmethod
    def _store_url(cls, value: str) -> str:
        return check_url(value, _STORE_SCHEMES, accepted("store_url"))

    @field_validator("broker_url")
    @classmethod
    def _broker_url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value, _BROKER_SCHEMES, accepted("broker_url"))

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value, _REDIS_SCHEMES, accepted("redis_url"))

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not MODEL_NAME.fullmatch(value):  # else it failed later, after the stores were made
            raise ValueError(f"expected {_ACCEPTED['model']}")
        return value

    @field_validator("model_base_url")
    @classmethod
    def _model_base_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_http_url(value, accepted("model_base_url"))
        return value

    @field_validator("model_api_key")
    @classmethod
    def _model_api_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError(f"expected {accepted('model_api_key')}")
        return value

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_http_url(value, accepted("public_url"), query=False)
            return value.rstrip("/")
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _allowed_hosts_text(cls, value: Any) -> Any:
        return comma_separated(value)

    @field_validator("allowed_hosts")
    @classmethod
    def _allowed_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for host in value:
            if not is_host(host):
                raise ValueError(
                    f"{host!r} is not a host name (no scheme, no port, no wildcard: "
                    f"expected {accepted('allowed_hosts')})"
                )
        return tuple(host.lower() for host in value)

    @field_validator("ops_tokens", mode="before")
    @classmethod
    def _ops_tokens_text(cls, value: Any) -> Any:
        return token_text(value, "name:role:secret")

    @field_validator("ops_tokens")
    @classmethod
    def _ops_tokens(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        return check_tokens(value, roles=("operator", "viewer"))

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not is_host(value):
            raise ValueError(f"expected {accepted('host')}")
        return value

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, profiles: tuple[Profile, ...]) -> tuple[Profile, ...]:
        seen: dict[str, int] = {}
        for index, profile in enumerate(profiles):
            if profile.name in seen:
                raise ValueError(
                    f"profiles[{seen[profile.name]}] and profiles[{index}] are both named "
                    f"{profile.name}: profile names must be unique"
                )
            seen[profile.name] = index
        return profiles

    @field_validator("routes")
    @classmethod
    def _routes(cls, routes: tuple[Route, ...], info: ValidationInfo) -> tuple[Route, ...]:
        profiles = info.data.get("profiles")
        if profiles is not None:  # else the profiles' own error says what is wrong
            names = [profile.name for profile in profiles]
            for index, route in enumerate(routes):
                if route.profile is not None and route.profile not in names:
                    known = ", ".join(names) if names else "none are defined"
                    raise ValueError(
                        f"routes[{index}] names the profile {route.profile!r}, which is not "
                        f"defined (profiles: {known})"
                    )
        for later, route in enumerate(routes):
            for earlier, first in enumerate(routes[:later]):
                if first.channel != route.channel or first.space not in ("*", route.space):
                    continue
                binds = f"{route.channel} space {route.space}"
                if first.space == route.space:
                    raise ValueError(
                        f"routes[{earlier}] and routes[{later}] both bind {binds}: the first "
                        f"match wins, so routes[{later}] would never apply"
                    )
                raise ValueError(
                    f"routes[{later}] ({binds}) comes after routes[{earlier}] "
                    f"({route.channel} space *), which takes every space first: put specific "
                    "spaces before *"
                )
        return routes

    @model_validator(mode="after")
    def _relations(self) -> Settings:
        problems: list[Relation | None] = [
            Relation(
                ("renew_seconds", "lease_seconds"),
                "3 x renew_seconds must be less than lease_seconds, so a lease survives one "
                "failed renewal",
            )
            if 3 * self.renew_seconds >= self.lease_seconds
            else None,
            Relation(
                ("linger_seconds", "lease_seconds"),
                "3 x linger_seconds must be at most lease_seconds, so the lease a lingering "
                "session does not renew outlasts its linger",
            )
            if 3 * self.linger_seconds > self.lease_seconds
            and "linger_seconds" in self.model_fields_set  # the default is cut to a third
            else None,
            Relation(
                ("drain_seconds", "shutdown_seconds"),
                "drain_seconds must be less than shutdown_seconds, so the drain ends before "
                "the process is stopped",
            )
            if self.drain_seconds >= self.shutdown_seconds
            else None,
            Relation(
                ("delivery_timeout_seconds", "outbox_lease_seconds"),
                "2 x delivery_timeout_seconds must be less than outbox_lease_seconds, so a "
                "delivery and its reconciliation end before another deliverer may take it",
            )
            if 2 * self.delivery_timeout_seconds >= self.outbox_lease_seconds
            else None,
        ]
        if not self.ops_tokens and not is_loopback(self.host):
            problems.append(
                Relation(
                    ("host", "ops_tokens"),
                    f"host={self.host} is not a loopback address: set ops_tokens, so the "
                    "operator API is never reachable without authentication",
                )
            )
        failed = [problem for problem in problems if problem is not None]
        if failed:
            raise Relations(failed)
        return self

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` (a command-line flag over a setting), checked like any.

        Unlike ``model_copy(update=...)`` it validates, and unlike validating ``model_dump()``
        it keeps which settings were set explicitly (what `effective_store_url` reads). A
        channel's setting is named as a variable names it (``email_approvers``) and changes the
        section `channels` holds.
        """
        kept = {name: getattr(self, name) for name in self.model_fields_set}
        channels = dict(self.channels)
        for name in list(changes):
            section, _, field = name.partition("_")
            if name not in Settings.model_fields and section in channels:
                held = channels[section]
                given = {f: getattr(held, f) for f in held.model_fields_set}
                channels[section] = type(held).model_validate({**given, field: changes.pop(name)})
        return Settings.model_validate({**kept, **changes, "channels": channels})

    @property
    def effective_store_url(self) -> str:
        """The store: store_url when set explicitly, else redis_url when set, else the default."""
        if "store_url" in self.model_fields_set or self.redis_url is None:
            return self.store_url
        return self.redis_url

    @property
    def effective_broker_url(self) -> str:
        """The broker: broker_url when set, else redis_url when set, else SQLite under .gateway."""
        return self.broker_url or self.redis_url or DEFAULT_BROKER_URL

    def section(self, name: str, model: type[S]) -> S:
        """Channel `name`'s settings, or `model`'s defaults when none were given.

        Raises:
            TypeError: the section held under `name` is not a `model`.
        """
        found = self.channels.get(name)
        if found is None:
            return model()
        if not isinstance(found, model):
            raise TypeError(f"the {name} section is a {type(found).__name__}, not {model.__name__}")
        return found

    def route_for(self, channel: str, space: str) -> str:
        """The session a thread of `space` in `channel` belongs to.

        The first route whose channel is `channel` and whose space is `space` or ``*`` wins;
        with none, the session is `default_session(channel, space)` (``slack-C123``).
        """
        for route in self.routes:
            if route.matches(channel, space):
                return route.session
        return default_session(channel, space)

    @property
    def default_profile(self) -> Profile:
        """The profile of threads whose route names none.

        The one named ``default`` if defined, else one made of the top-level settings; either
        way with its unset fields filled from the top level (see `profile_for`).
        """
        return self._effective(self._named(DEFAULT_PROFILE) or Profile(name=DEFAULT_PROFILE))

    def profile_named(self, name: str) -> Profile | None:
        """The profile called `name` (unset fields filled from the top level), or None."""
        found = self._named(name)
        if found is None:
            return self.default_profile if name == DEFAULT_PROFILE else None
        return self._effective(found)

    def profile_for(self, channel: str, space: str) -> Profile:
        """The profile of a thread of `space` in `channel`: its route's, else the default.

        The route is the one `route_for` takes (the first match). The profile returned has
        instructions, busy_policy, max_attempts, max_turns and token_budget filled from the top
        level when it leaves them unset; model stays unset when unset (the service's model:
        ``GATEWAY_MODEL`` or the plugin's), and so do allow_tools (every tool) and approvers (the
        channel's rule).
        """
        for route in self.routes:
            if route.matches(channel, space):
                if route.profile is not None:
                    found = self.profile_named(route.profile)
                    assert found is not None  # the routes' check
                    return found
                break
        return self.default_profile

    def _named(self, name: str) -> Profile | None:
        return next((profile for profile in self.profiles if profile.name == name), None)

    def _effective(self, profile: Profile) -> Profile:
        return profile.model_copy(
            update={
                "instructions": profile.instructions
                if profile.instructions is not None
                else self.instructions,
                "busy_policy": profile.busy_policy or self.busy_policy,
                "max_attempts": profile.max_attempts or self.max_attempts,
                "max_turns": profile.max_turns or self.max_turns,
                "token_budget": profile.token_budget or self.token_budget,
            }
        )

    def warnings(self, channel_state: Mapping[str, str] | None = None) -> tuple[str, ...]:
        """What these settings allow but an operator should know (one line each, to log).

        `channel_state`: where channels keep state of their own (``web channel`` -> its URL),
        warned about with the store when they are local files and the broker is shared.
        """
        found: list[str] = []
        web_login = bool(getattr(self.channels.get("web"), "tokens", ()))
        if not is_loopback(self.host) and not web_login:
            found.append(
                f"host={self.host} is not a loopback address: the web channel has no "
                f"authentication, so anyone who reaches port {self.port} can talk to the agent "
                "(set web tokens, GATEWAY_WEB_TOKENS, bind 127.0.0.1, or put an "
                "authenticating proxy in front)"
            )
        if scheme(self.effective_broker_url) in _REDIS_SCHEMES:
            local = [
                f"the {part} ({scheme(url)})"
                for part, url in (
                    ("store", self.effective_store_url),
                    *(channel_state or {}).items(),
                )
                if scheme(url) in _LOCAL_SCHEMES
            ]
            if local:
                found.append(
                    f"the broker is Redis but {' and '.join(local)} "
                    f"{'are local files' if len(local) > 1 else 'is a local file'}: every "
                    "`gateway serve` sharing the broker must run on this machine"
                )
        if scheme(self.effective_store_url) == "memory":
            found.append(
                "the store is memory://: sessions are lost when the process stops, while the "
                "broker keeps their messages and replies"
            )
        return tuple(found)


def accepted(name: str) -> str:
    """What setting `name` accepts, in words (for error messages and the example files)."""
    return accepted_in(Settings, name, _ACCEPTED)


def default_text(name: str) -> str:
    """Setting `name`'s default as a person writes it (``unset`` when it has none)."""
    return default_text_in(Settings, name)


_ACCEPTED = {
    "store_url": "a store URL: sqlite:///file.db, redis://host:port/db (rediss:// for TLS, "
    "redis+cluster://host:port for a Redis Cluster), jsonl:///dir or memory://",
    "broker_url": "a broker URL: sqlite:///file.db or redis://host:port/db (rediss:// for TLS, "
    "redis+cluster://host:port for a Redis Cluster)",
    "redis_url": "a Redis URL: redis://host:port/db, rediss://host:port/db, or "
    "redis+cluster://host:port (rediss+cluster:// for TLS) for a Redis Cluster",
    "model": "provider:model_id, e.g. openai:gpt-4.1-mini or scripted:echo",
    "model_api_key": "the provider's key (not empty)",
    "model_base_url": "an http:// or https:// URL",
    "host": "an IP address or a host name (no scheme, no port)",
    "routes": 'a list of routes {"channel", "space", "session", "profile"}: JSON in '
    "GATEWAY_ROUTES, [[routes]] tables in TOML",
    "profiles": 'a list of profiles {"name", "instructions", "model", "allow_tools", '
    '"deny_tools", "approvers", "busy_policy", "max_attempts", "max_turns", "token_budget"}: '
    "JSON in GATEWAY_PROFILES, [[profiles]] tables in TOML",
    "instructions": "text (up to 100,000 characters)",
    "plugin": "a Python module like agent (./agent.py) or mypkg.agent, or the path of a .py "
    "file like examples/agent.py",
    "public_url": "an http:// or https:// URL",
    "allowed_hosts": "host names like gateway.example.com, comma-separated (a list in TOML)",
}

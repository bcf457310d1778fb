"""The MCP servers a deployment connects (``[[mcp.servers]]`` in TOML, ``GATEWAY_MCP_SERVERS``).

`McpSection` is a settings section like a channel's (`config.sections.Section`): its one field
``servers`` is the setting ``mcp_servers``, a list of tables in TOML and a JSON list in the
variable. `load_gateway_settings` reads it beside the channels' sections (`gateway_sections`).
A server is started with a command (stdio) or reached at a URL (Streamable HTTP), never both;
environment values, header values and the bearer token are secrets (never shown, logged or
stored; `mcp_secrets` hands them to the redactor).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from config import Settings
from config.fields import check_http_url
from config.sections import Section
from harness_core.backends.urls import userinfo_password

__all__ = ["SECTION", "McpSection", "McpServer", "McpToolOverride", "mcp_secrets", "mcp_section"]

SECTION = "mcp"
"""The section's name: ``[mcp]`` in TOML, ``GATEWAY_MCP_*`` variables."""

SERVER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
"""A server's name: the prefix of its tools' names (``<server>.<tool>``)."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
_APPROVER = re.compile(r"[^\s,]{1,100}")
_SECRET_NAME = re.compile(r"key|token|secret|passw|auth|credential", re.IGNORECASE)
"""A command-line flag or URL query name whose value is a secret (``--api-key``, ``?token=``)."""
_WORDLIKE = re.compile(r"[A-Za-z][A-Za-z-]*|[A-Za-z]+/[A-Za-z0-9.+-]+")
"""``production``, ``application/json``: values that are more likely settings than secrets."""


class _Table(BaseModel):
    """A table inside the section: frozen, no unknown keys, no NaN, no booleans for numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name
        if name is None:
            return value
        annotation = cls.model_fields[name].annotation
        takes_bool = bool in (annotation, *getattr(annotation, "__args__", ()))
        if isinstance(value, bool) and not takes_bool:
            raise ValueError("true or false is not accepted here")
        if takes_bool and value is not None and not isinstance(value, bool):
            # `trusted = "yes"` made a server trusted (pydantic reads "yes" as true): a switch
            # that grants trust or waives approval is written true or false, nothing else
            raise ValueError("give true or false (not a string or a number)")
        return value


class McpToolOverride(_Table):
    """The operator's word on one tool, over what its annotations say (always wins)."""

    replay: Literal["never", "safe"] | None = None
    """``safe``: a call cut by a crash may run again; ``never``: reported "may have happened"."""
    approval: bool | None = None
    """Whether a call waits for a person's approval."""
    approvers: tuple[str, ...] | None = None
    """Who may decide a call of this tool (besides the channel's and the profile's rules)."""
    disabled: bool = False
    """Not offered to the model at all."""

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for who in value or ():
            if not _APPROVER.fullmatch(who):
                raise ValueError(f"{who!r} is not an author id (1-100 characters, no spaces)")
        return value


class McpServer(_Table):
    """One MCP server: how to start or reach it, its bounds, and how far its hints are taken."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, SecretStr] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    bearer_token: SecretStr | None = None
    start_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    call_timeout_seconds: float = Field(default=120.0, gt=0, le=86_400)
    tools: tuple[str, ...] = ("*",)
    """Which of its tools to offer: names or fnmatch patterns (``get_*``) over its own names."""
    trusted: bool = False
    max_output_chars: int = Field(default=20_000, ge=200, le=1_000_000)
    overrides: dict[str, McpToolOverride] = Field(default_factory=dict)
    """Per tool, by its own name (a key given as ``<server>.<tool>`` is read as ``<tool>``)."""
    not_secret: tuple[str, ...] = ()
    """Names in `env` or `headers` whose values are no secret (``NODE_ENV``, ``Accept``): they
    are not redacted. Every other value is, wherever it appears, in answers too (D307)."""

    @property
    def transport(self) -> Literal["stdio", "http"]:
        """``stdio`` (a command this process starts) or ``http`` (Streamable HTTP at a URL)."""
        return "stdio" if self.command is not None else "http"

    @property
    def target(self) -> str:
        """What it runs or reaches, without secrets: the program's name, or the bare URL."""
        if self.command is not None:
            return self.command.replace("\\", "/").rsplit("/", 1)[-1]
        assert self.url is not None  # validated: a command or a URL
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"

    def secrets(self) -> Iterator[str]:
        """Every secret value it holds.

        The environment and header values not named in `not_secret`, the token, the URL's
        password.
        """
        for value in self._secret_values().values():
            whole = value.get_secret_value()
            yield whole
            scheme, _, rest = whole.partition(" ")
            if rest and scheme.isalpha():  # "Bearer x": the whole, and x
                yield rest
        if self.bearer_token is not None:
            yield self.bearer_token.get_secret_value()
        if self.url is not None and (password := userinfo_password(self.url)):
            yield password
        # keys people pass the way a server's README shows (`npx server --api-key X`,
        # `https://host/mcp?api_key=X`): a server's stderr repeats them into the health
        for flag, arg in zip(("", *self.args), self.args, strict=False):
            name, equals, given = arg.partition("=")
            if equals and name.startswith("-") and _SECRET_NAME.search(name) and given:
                yield given
            elif flag.startswith("-") and _SECRET_NAME.search(flag) and not arg.startswith("-"):
                yield arg
        if self.url is not None:
            for pair in urlsplit(self.url).query.split("&"):
                name, equals, given = pair.partition("=")
                if equals and given and _SECRET_NAME.search(name):
                    yield given

    def word_valued(self, min_chars: int, shown: frozenset[str] = frozenset()) -> list[str]:
        """Where a secret value that answers may well hold is set: worth a warning (D307).

        The names in `env` and `headers` (``header <name>``) whose value, of `min_chars` or
        more, reads like a word or a media type, and is not one of `shown` (casefolded: the
        servers' names, which `mcp_secrets` keeps out of the redactor).
        """
        return [
            name
            for name, value in self._secret_values().items()
            if len(text := value.get_secret_value()) >= min_chars
            and _WORDLIKE.fullmatch(text)
            and text.casefold() not in shown
        ]

    def _secret_values(self) -> dict[str, SecretStr]:
        plain = {name.lower() for name in self.not_secret}
        values = dict(self.env)
        values.update((f"header {name}", v) for name, v in self.headers.items())
        return {
            name: value
            for name, value in values.items()
            if name.removeprefix("header ").lower() not in plain
        }

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not SERVER_NAME.fullmatch(value):
            raise ValueError(
                f"server name {value!r} is not 1-32 of a-z, 0-9, _ and -, starting with a letter"
            )
        return value

    @field_validator("command", "cwd")
    @classmethod
    def _text(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and (not value.strip() or "\x00" in value):
            raise ValueError(f"{info.field_name} is empty or holds a NUL character")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        check_http_url(value, "an http:// or https:// URL")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, text in value.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an HTTP header name")
            if any(c in text.get_secret_value() for c in "\r\n\x00"):
                raise ValueError(f"the value of header {name!r} holds a line break or NUL")
        return value

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not pattern.strip() for pattern in value):
            raise ValueError("a tools entry is empty (give names or patterns like get_*)")
        return value

    @model_validator(mode="after")
    def _own_tool_names(self) -> McpServer:
        # `tickets.close` is the name the thread, the approval prompt and `ops mcp` show: an
        # override keyed by it means the tool `close` (it was ignored, its approval skipped)
        prefix = f"{self.name}."
        own: dict[str, McpToolOverride] = {}
        for key, override in self.overrides.items():
            name = key.removeprefix(prefix)
            if name in own:
                raise ValueError(
                    f"server {self.name!r}: overrides name the tool {name!r} twice "
                    f"({name!r} and {prefix + name!r})"
                )
            own[name] = override
        if own != self.overrides:
            object.__setattr__(self, "overrides", own)
        return self

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        where = f"server {self.name!r}"
        if self.command is not None and self.url is not None:
            raise ValueError(f"{where} has both command (stdio) and url (HTTP): keep one")
        if self.command is None and self.url is None:
            raise ValueError(f"{where} has neither command (stdio) nor url (HTTP)")
        stdio_only = [n for n in ("args", "env", "cwd") if n in self.model_fields_set]
        http_only = [n for n in ("headers", "bearer_token") if n in self.model_fields_set]
        if self.command is None and stdio_only:
            raise ValueError(f"{where} has a url: {', '.join(stdio_only)} apply to a command")
        if self.url is None and http_only:
            raise ValueError(f"{where} has a command: {', '.join(http_only)} apply to a url")
        if self.bearer_token is not None and any(
            name.lower() == "authorization" for name in self.headers
        ):
            raise ValueError(f"{where} sets both bearer_token and an Authorization header")
        named = {name.lower() for name in (*self.env, *self.headers)}
        for name in self.not_secret:
            if name.lower() not in named:
                raise ValueError(
                    f"{where}: not_secret names {name!r}, which is in neither env nor headers"
                )
        return self


class McpSection(Section):
    """The MCP servers whose tools the agent may call (none by default)."""

    ACCEPTS: ClassVar[dict[str, str]] = {
        "servers": "a list of servers, each with name and command (stdio) or url (HTTP)",
    }
    EXAMPLES: ClassVar[dict[str, Any]] = {
        "servers": [
            {
                "name": "tickets",
                "command": "python",
                "args": ["-m", "tickets_mcp"],
                "env": {"TICKETS_TOKEN": "change-me"},
                "tools": ["*"],
                "overrides": {"close_ticket": {"approval": True, "approvers": ["ops-lead"]}},
            },
            {
                "name": "docs",
                "url": "https://mcp.example.com/mcp",
                "bearer_token": "change-me-too",
                "trusted": True,
            },
        ]
    }
    JSON_FIELDS: ClassVar[frozenset[str]] = frozenset({"servers"})
    JSON_EXAMPLES: ClassVar[dict[str, str]] = {
        "servers": 'a JSON list of servers, like [{"name":"tickets","command":"tickets-mcp"}]',
    }

    servers: tuple[McpServer, ...] = Field(
        default=(),
        description="MCP servers whose tools the agent may call, each by name (its tools are "
        "<name>.<tool>): command, args, env, cwd start one (stdio); url, headers, bearer_token "
        "reach one (Streamable HTTP). Also start_timeout_seconds, call_timeout_seconds, tools "
        "(names or patterns to offer), trusted (take its annotations as declared), "
        "max_output_chars, overrides per tool (replay, approval, approvers, disabled) and "
        "not_secret (env or header names whose values need no redacting). "
        "See docs/mcp.md.",
    )

    @field_validator("servers")
    @classmethod
    def _unique(cls, value: tuple[McpServer, ...]) -> tuple[McpServer, ...]:
        seen: set[str] = set()
        for server in value:
            if server.name in seen:
                raise ValueError(f"two MCP servers are named {server.name!r}: names must differ")
            seen.add(server.name)
        return value


def mcp_section(settings: Settings) -> McpSection:
    """The MCP section of `settings` (its defaults, no servers, when none was given)."""
    return settings.section(SECTION, McpSection)


def mcp_secrets(settings: Settings) -> list[str]:
    """Every secret of every configured MCP server (for the redactor).

    But a server's name: `name = "postgres"` beside ``PGUSER = "postgres"`` made every tool
    `[redacted].query`, in approval prompts too, and a name is shown everywhere by design.
    """
    servers = mcp_section(settings).servers
    names = {server.name.casefold() for server in servers}
    return [
        secret
        for server in servers
        for secret in server.secrets()
        if secret.casefold() not in names
    ]

"""Reading the settings: the environment over a ``.env`` file over a TOML file over the defaults.

Each setting is taken whole from the strongest source that names it (``GATEWAY_ROUTES`` replaces
the TOML file's ``[[routes]]``, it does not add to them). Every problem becomes one line naming
the setting, where it came from, the value (never a secret's) and what is accepted; a name that
is no setting is an error in every source, so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

import datetime
import difflib
import io
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dotenv.parser import parse_stream
from pydantic import BaseModel, SecretStr, ValidationError

from config.fields import Relations, accepted_in, default_text_in, number
from config.profiles import Profile
from config.sections import Section
from config.settings import _ACCEPTED, Settings

__all__ = [
    "Check",
    "ENV_PREFIX",
    "Setting",
    "settings_from",
    "settings_table",
    "SettingsError",
    "UnknownSetting",
    "format_settings_error",
    "load_settings",
]

ENV_PREFIX = "GATEWAY_"
CLIENT_VARIABLES = frozenset({"GATEWAY_OPS_URL", "GATEWAY_OPS_TOKEN", "GATEWAY_COMMAND"})
"""Read by the command line (`gateway ops`'s address and token; the command hints name, which
``scripts/run`` sets), not settings of the service: never an unknown setting."""
_ROUTES_EXAMPLE = '[{"channel":"slack","space":"C123","session":"ops"}]'
_PROFILES_EXAMPLE = '[{"name":"oncall","instructions":"...","allow_tools":["deploys.*"]}]'
_CORE_JSON = {
    "routes": f"a JSON list of routes, like {_ROUTES_EXAMPLE}",
    "profiles": f"a JSON list of profiles, like {_PROFILES_EXAMPLE}",
}
_KEYS = {
    "routes": "a route has channel, session and optionally space (* by default) and profile",
    "profiles": "a profile has name and (optional) "
    + ", ".join(name for name in Profile.model_fields if name != "name"),
}
_SHOWN = 80

Check = Callable[[Any], object]
"""A caller's further check of a valid setting's value: raises ValueError (its message one line
that shows the value, never a secret) when the value cannot be used."""


@dataclass(frozen=True)
class Setting:
    """One setting as a person names it: a core field, or a field of a channel's section.

    A section's field ``bot_token`` of channel ``slack`` is the setting ``slack_bot_token``:
    ``GATEWAY_SLACK_BOT_TOKEN`` in the environment, ``bot_token`` in the TOML file's
    ``[slack]`` table (or ``slack_bot_token`` at its top, as before sections).
    """

    name: str
    model: type[BaseModel]
    field: str
    section: str | None = None

    @property
    def secret(self) -> bool:
        """Whether its value is never shown (a `SecretStr`, or a tuple of them)."""
        annotation = self.model.model_fields[self.field].annotation
        return SecretStr in (annotation, *_args(annotation))

    @property
    def json_example(self) -> str | None:
        """What a variable holds when this setting is JSON there (a table in TOML), or None."""
        if self.section is None:
            return _CORE_JSON.get(self.name)
        model = self.model
        if issubclass(model, Section) and self.field in model.JSON_FIELDS:
            return model.JSON_EXAMPLES.get(self.field, "JSON")
        return None

    def accepted(self) -> str:
        """What it accepts, in words."""
        if issubclass(self.model, Section):
            return self.model.accepted(self.field)
        return accepted_in(self.model, self.field, _ACCEPTED)

    def default_text(self) -> str:
        """Its default as a person writes it."""
        return default_text_in(self.model, self.field)

    def default(self) -> Any:
        """Its default value."""
        return self.model.model_fields[self.field].get_default(call_default_factory=True)


def _args(annotation: Any) -> tuple[Any, ...]:
    found: list[Any] = []
    for arg in getattr(annotation, "__args__", ()):
        found += [arg, *_args(arg)]
    return tuple(found)


def settings_table(sections: Mapping[str, type[Section]] | None = None) -> dict[str, Setting]:
    """Every setting by its name: the core ones, then each section's (``<section>_<field>``).

    Raises:
        ValueError: a section's setting would have the name of another setting.
    """
    table = {name: Setting(name, Settings, name) for name in Settings.model_fields}
    del table["channels"]  # the sections themselves
    for section, model in (sections or {}).items():
        for field in model.model_fields:
            name = f"{section}_{field}"
            if name in table:
                raise ValueError(f"the {section} section's {field} is also the setting {name}")
            table[name] = Setting(name, model, field, section)
    return table


class SettingsError(ValueError):
    """Settings that cannot be used.

    `problems` holds one line per problem, each naming the setting, where it came from, the bad
    value (never a secret's) and what is accepted; ``str()`` is the first, and how many more.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems) or ("invalid settings",)
        more = len(self.problems) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        super().__init__(self.problems[0] + suffix)


class UnknownSetting(SettingsError):
    """A ``GATEWAY_*`` variable or a TOML key names no setting (most likely a typo)."""


def load_settings(
    environ: Mapping[str, str] | None = None,
    *,
    config_file: str | os.PathLike[str] | None = None,
    env_file: str | os.PathLike[str] | None = None,
    sections: Mapping[str, type[Section]] | None = None,
    checks: Mapping[str, Check] | None = None,
) -> Settings:
    """Read and check the settings (called once, by the entry point).

    Sources, strongest first: `environ` (the process environment when None), then `env_file`
    (by default ``.env`` in the current directory if it exists, but only when `environ` is
    None: a caller who passes the environment passes all of it), then `config_file` (TOML, e.g.
    ``gateway serve --config gateway.toml``), then the defaults. Only ``GATEWAY_*`` variables
    are read; values in ``.env`` are literal (no ``${VAR}`` expansion). `sections`: each
    channel's settings model by the channel's name (the registry's), read from the
    ``[<name>]`` table and ``GATEWAY_<NAME>_*`` variables into `Settings.channels`. `checks`:
    a further check per setting name, run on a set value once every value is valid (what only
    the caller can judge, like a URL its backends parse).

    Raises:
        UnknownSetting: a ``GATEWAY_*`` variable or a TOML key names no setting.
        SettingsError: a file cannot be read or parsed, a value is empty, of the wrong type or
            out of range, or settings do not work together; ``str()`` is one line.
    """
    table = settings_table(sections)
    problems: list[str] = []
    unknown: list[str] = []
    values: dict[str, _Value] = {}
    if config_file is not None:
        values.update(_read_toml(Path(config_file), table, problems, unknown))
    dotenv = Path(env_file) if env_file is not None else None
    if dotenv is None and environ is None and Path(".env").is_file():
        dotenv = Path(".env")
    if dotenv is not None:
        values.update(_from_variables(_read_dotenv(dotenv), table, problems, unknown))
    process = os.environ if environ is None else environ
    variables = ((key, value, "the environment") for key, value in process.items())
    values.update(_from_variables(variables, table, problems, unknown))
    if unknown:
        raise UnknownSetting(unknown + problems)
    if problems:
        raise SettingsError(problems)
    return _validated(values, table, sections, checks)


def settings_from(
    values: Mapping[str, Any],
    *,
    sections: Mapping[str, type[Section]] | None = None,
    checks: Mapping[str, Check] | None = None,
) -> Settings:
    """`Settings` from values by setting name (``slack_bot_token=...`` for a section's field).

    What a program embedding the gateway (and a test) builds settings with: the names are the
    variables' names without ``GATEWAY_``, checked like `load_settings` checks them.

    Raises:
        SettingsError: a name is no setting, or a value is refused (``str()`` is one line).
    """
    table = settings_table(sections)
    unknown = [
        f"unknown setting {name}{_hint(name, False, table)}" for name in values if name not in table
    ]
    if unknown:
        raise UnknownSetting(unknown)
    given = {name: _Value(value, "given") for name, value in values.items()}
    return _validated(given, table, sections, checks)


def _validated(
    values: Mapping[str, _Value],
    table: Mapping[str, Setting],
    sections: Mapping[str, type[Section]] | None,
    checks: Mapping[str, Check] | None = None,
) -> Settings:
    problems: list[str] = []
    channels: dict[str, Section] = {}
    for section, model in (sections or {}).items():
        given = {
            setting.field: values[name].value
            for name, setting in table.items()
            if setting.section == section and name in values
        }
        try:
            channels[section] = model.model_validate(given)
        except ValidationError as exc:
            problems += _problems(exc, values, table, section)
    core = {name: value.value for name, value in values.items() if table[name].section is None}
    try:
        settings = Settings.model_validate({**core, "channels": channels})
    except ValidationError as exc:
        # `from None`: pydantic's error repeats every input, secrets included
        raise SettingsError(problems + _problems(exc, values, table)) from None
    for name, check in (checks or {}).items():
        if name in values:
            try:
                check(values[name].value)
            except ValueError as exc:  # its message shows the value (without a password)
                problems.append(f"{name} ({values[name].origin}): {exc}")
    if problems:
        raise SettingsError(problems)
    return settings


def format_settings_error(exc: SettingsError | ValidationError) -> str:
    """One line for the command line, from a `SettingsError` or a ``Settings(...)`` error."""
    if isinstance(exc, ValidationError):
        return str(SettingsError(_problems(exc, {}, settings_table())))
    return str(exc)


@dataclass(frozen=True)
class _Value:
    """A setting's raw value and where it came from (for error messages)."""

    value: Any
    origin: str
    item_origins: tuple[str, ...] = ()

    def where(self, index: object = None) -> str:
        if isinstance(index, int) and 0 <= index < len(self.item_origins):
            return self.item_origins[index]
        return self.origin


# --- sources ------------------------------------------------------------------------------


def _read_toml(
    path: Path, table: Mapping[str, Setting], problems: list[str], unknown: list[str]
) -> dict[str, _Value]:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        # a relative path says where it was looked for (scripts/run runs from the repository)
        where = "" if path.is_absolute() else f" (read from {Path.cwd()})"
        begin = ""
        if isinstance(exc, FileNotFoundError) and (path.parent / "gateway.example.toml").is_file():
            begin = " (copy gateway.example.toml beside it to begin)"
        raise SettingsError(
            [f"cannot read config file {path}{where}: {exc.strerror or exc}{begin}"]
        ) from None
    except UnicodeDecodeError as exc:
        raise SettingsError(
            [f"config file {path} is not UTF-8 text (byte {exc.start} cannot be decoded)"]
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError([f"config file {path} is not valid TOML: {exc}"]) from None
    except RecursionError:
        raise SettingsError([f"config file {path} is not valid TOML: nested too deep"]) from None
    lines = text.splitlines()
    sections = {setting.section for setting in table.values() if setting.section is not None}
    values: dict[str, _Value] = {}
    for key, value in data.items():
        if key in sections and isinstance(value, dict):
            for field, item in value.items():
                name = f"{key}_{field}"
                line = _toml_line(lines, field, within=key) or _toml_line(lines, key)
                if name not in table or table[name].section != key:
                    unknown.append(
                        f"unknown setting {field!r} in the [{key}] table of {path}{_line(line)}"
                        f"{_hint(field, False, table, key)}"
                    )
                    continue
                where = f"{key}.{field} in {path}" + (f" line {line}" if line else "")
                if name in values:  # the flat form too (`slack_bot_token` beside [slack])
                    unknown.append(f"{values[name].origin} and {where} both set {name}: keep one")
                    continue
                values[name] = _Value(item, where)
            continue
        line = _toml_line(lines, key)
        where = f"{key} in {path}" + (f" line {line}" if line else "")
        if key in sections:  # a section given as a value, not a table
            unknown.append(
                f"{key} in {path}{_line(line)} is the {key} channel's section: write its "
                f"settings under a [{key}] table"
            )
            continue
        if key not in table:
            unknown.append(
                f"unknown setting {key!r} in {path}{_line(line)}{_hint(key, False, table)}"
            )
            continue
        item_origins = tuple(
            f"{key} in {path} line {lineno}"
            for lineno, text_line in enumerate(lines, 1)
            if table[key].json_example is not None
            and re.match(rf"\s*\[\[\s*{re.escape(key)}\s*\]\]", text_line)
        )
        if key in values:  # its table form came first
            unknown.append(f"{values[key].origin} and {where} both set {key}: keep one")
            continue
        values[key] = _Value(value, where, item_origins)
    return values


def _toml_line(lines: Sequence[str], key: str, within: str | None = None) -> int | None:
    """The line that sets `key` at the top, or in table `within` (best effort: for messages)."""
    name = rf"(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')"
    table = None if within is None else rf"\[\s*{re.escape(within)}\s*\]"
    inside = within is None
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("["):
            if within is None and re.match(rf"\[\[?\s*{name}\s*[\].]", stripped):
                return lineno
            inside = table is not None and re.fullmatch(table, stripped) is not None
        elif inside and re.match(rf"{name}\s*[=.]", stripped):
            return lineno
    return None


def _read_dotenv(path: Path) -> list[tuple[str, str | None, str]]:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise SettingsError([f"cannot read env file {path}: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise SettingsError(
            [f"env file {path} is not UTF-8 text (byte {exc.start} cannot be decoded)"]
        ) from None
    found: list[tuple[str, str | None, str]] = []
    for binding in parse_stream(io.StringIO(text)):
        line = binding.original.line + binding.original.string.count("\n", 0, _lead(binding))
        if binding.error:
            # never echo the line: it may hold a key
            raise SettingsError([f"env file {path} line {line} is not KEY=value nor a comment"])
        if binding.key is not None:
            found.append((binding.key, binding.value, f"{path} line {line}"))
    return found


def _lead(binding: Any) -> int:
    """Where a binding's own text starts (the parser counts blank lines before it in)."""
    original: str = binding.original.string
    return len(original) - len(original.lstrip("\n\r\t "))


def _from_variables(
    variables: Iterable[tuple[str, str | None, str]],
    table: Mapping[str, Setting],
    problems: list[str],
    unknown: list[str],
) -> dict[str, _Value]:
    """`(name, value, where)` of each variable -> the settings the ``GATEWAY_*`` ones set."""
    values: dict[str, _Value] = {}
    seen: dict[str, str] = {}
    for key, raw, where in variables:
        if not key.upper().startswith(ENV_PREFIX) or key.upper() in CLIENT_VARIABLES:
            continue
        name = key[len(ENV_PREFIX) :].lower()
        origin = f"{key} in {where}"
        if name not in table:
            unknown.append(f"unknown setting {key} in {where}{_hint(name, True, table)}")
            continue
        setting = table[name]
        if name in seen:
            problems.append(f"{seen[name]} and {origin} both set {name}: keep one")
            continue
        seen[name] = origin
        example = setting.json_example
        if raw is None or not raw.strip():
            problems.append(
                f"{origin} is set but empty: give {setting.accepted()}, or unset it "
                f"(default: {setting.default_text()})"
            )
        elif example is not None:
            try:
                values[name] = _Value(json.loads(raw, object_pairs_hook=_once_each), origin)
            except json.JSONDecodeError as exc:
                problems.append(
                    f"{origin} is not JSON ({exc.msg} at character {exc.pos + 1}): expected "
                    f"{example}"
                )
            except RecursionError:
                problems.append(f"{origin} is nested too deep: expected {example}")
            except _KeyTwice as exc:
                problems.append(f"{origin} gives {exc.key!r} twice in one object: keep one")
        else:
            values[name] = _Value(raw, origin)
    return values


class _KeyTwice(ValueError):
    """A JSON object of a setting gives one key twice (TOML and ``.env`` refuse that too)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are given once each (the later one silently won)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _KeyTwice(key)
        found[key] = value
    return found


def _hint(
    name: str, variable: bool, table: Mapping[str, Setting], section: str | None = None
) -> str:
    if section is not None:  # a key of a section's table: its own fields
        known = sorted(s.field for s in table.values() if s.section == section)
    else:
        known = sorted(table)
    bare = name.lower().removeprefix(ENV_PREFIX.lower())  # a TOML key spelt as a variable
    close = difflib.get_close_matches(bare, known, n=1)
    spell = (lambda field: f"{ENV_PREFIX}{field.upper()}") if variable else str
    if close:
        return f"; did you mean {spell(close[0])}?"
    if len(known) > _LISTED:  # a line of 87 names helped nobody
        where = ".env.example" if variable else "gateway.example.toml"
        return f"; {where} and the README's Configure it section list every setting"
    return f"; known: {', '.join(spell(field) for field in known)}"


_LISTED = 20
"""The most known names an unknown one's error lists (past it: where they are listed)."""


def _line(line: int | None) -> str:
    return f" line {line}" if line else ""


# --- validation errors --------------------------------------------------------------------


def _problems(
    exc: ValidationError,
    values: Mapping[str, _Value],
    table: Mapping[str, Setting],
    section: str | None = None,
) -> list[str]:
    """One line per error of a model's validation (the core's, or `section`'s)."""
    prefix = "" if section is None else f"{section}_"
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        cause = error.get("ctx", {}).get("error")
        if not loc:
            if isinstance(cause, Relations):
                lines.extend(
                    _relation(
                        tuple(prefix + field for field in rel.fields),
                        rel.rule,
                        error["input"],
                        values,
                        table,
                        prefix,
                    )
                    for rel in cause.relations
                )
            else:
                lines.append(str(cause or error["msg"]))
            continue
        field = prefix + str(loc[0])
        path = field + "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[1:]
        )
        source = values.get(field)
        origin = source.where(loc[1] if len(loc) > 1 else None) if source else "given"
        setting = table.get(field)
        hidden = setting is not None and (setting.secret or _secret_at(setting, loc[1:]))
        shown = "<hidden>" if hidden else _show(error["input"])
        kind = error["type"]
        # a section's list of tables (mcp_servers): its own keys, not a route's
        tables = setting is not None and setting.section is not None and len(loc) > 2

        def keys(field: str, otherwise: str, tables: bool = tables) -> str:
            return "" if tables else f": {_KEYS.get(field, otherwise)}"

        if kind == "extra_forbidden":
            if len(loc) == 1:
                lines.append(f"unknown setting {field} ({origin}){_hint(field, False, table)}")
            else:
                lines.append(f"unknown key {path} ({origin}){keys(field, 'not known')}")
        elif kind == "missing":
            lines.append(f"{path} is missing ({origin}){keys(field, 'it is required')}")
        elif kind == "value_error" and cause is not None:
            message = str(cause)
            if message.startswith("expected"):
                lines.append(f"{path}={shown} ({origin}): {message}")
            else:
                lines.append(f"{path} ({origin}): {message}")
        elif tables:
            lines.append(f"{path}={shown} ({origin}): {error['msg'].lower()}")
        else:
            lines.append(f"{path}={shown} ({origin}): expected {_expected(field, loc, table)}")
    return lines


def _secret_at(setting: Setting, loc: tuple[int | str, ...]) -> bool:
    """Whether the value at `loc` inside a setting's value is (or holds) a secret.

    Walks the annotation down the tables, lists and mappings `loc` names: an error in a
    server's ``env`` or ``headers`` never shows the value it refused, nor does one about a
    value that holds them (a single ``[mcp.servers]`` table where a list belongs showed the
    whole table, its bearer token included: an outside probe).
    """
    annotation: Any = setting.model.model_fields[setting.field].annotation
    for part in loc:
        if SecretStr in (annotation, *_args(annotation)):
            return True
        model = next(
            (
                a
                for a in (annotation, *_args(annotation))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
        if isinstance(part, str) and model is not None and part in model.model_fields:
            annotation = model.model_fields[part].annotation
            continue
        args = [a for a in _args(annotation) if a is not Ellipsis]
        annotation = args[-1] if args else None  # a list's item, a mapping's value
    return _holds_secret(annotation, set())


def _holds_secret(annotation: Any, seen: set[type[BaseModel]]) -> bool:
    """Whether a value of `annotation` is a secret or can hold one, at any depth."""
    for kind in (annotation, *_args(annotation)):
        if kind is SecretStr:
            return True
        if isinstance(kind, type) and issubclass(kind, BaseModel) and kind not in seen:
            seen.add(kind)
            if any(_holds_secret(f.annotation, seen) for f in kind.model_fields.values()):
                return True
    return False


def _expected(field: str, loc: tuple[int | str, ...], table: Mapping[str, Setting]) -> str:
    if field == "routes" and len(loc) == 2:
        return 'a route {"channel", "space", "session", "profile"}'
    if field == "profiles" and len(loc) == 2:
        return 'a profile {"name", "instructions", "model", "allow_tools", ...}'
    if field == "profiles" and len(loc) > 2:
        return _profile_field(loc[2])
    if field not in table or len(loc) > 2:
        return "text"  # a route's channel, space or session (or a `Route(...)` of its own)
    return table[field].accepted()


_PROFILE_WORDS = {
    **dict.fromkeys(("allow_tools", "deny_tools", "approvers"), "a list of text"),
    "busy_policy": "one of steer, follow_up, next_run",
    "instructions": "text (up to 100,000 characters)",
}
"""What a profile's fields accept where their types do not say it well; the rest (the numbers:
max_attempts, max_turns, token_budget) are read from the model's bounds."""


def _profile_field(name: int | str) -> str:
    if isinstance(name, str) and name in Profile.model_fields:
        return accepted_in(Profile, name, _PROFILE_WORDS)
    return "text"


def _relation(
    fields: tuple[str, ...],
    rule: str,
    given: Any,
    values: Mapping[str, _Value],
    table: Mapping[str, Setting],
    prefix: str,
) -> str:
    parts = []
    for field in fields:
        own = field.removeprefix(prefix)
        value = given.get(own) if isinstance(given, Mapping) else None
        setting = table.get(field)
        if value is None and setting is not None:
            value = setting.default()
        source = values.get(field)
        origin = (
            source.origin
            if source
            else ("given" if isinstance(given, Mapping) and own in given else "default")
        )
        if value is None or value in ((), "", {}):  # an empty default is unset, secret or not
            shown = "unset"
        elif setting is not None and setting.secret:
            shown = "<hidden>"
        else:
            shown = _plain(value)
        parts.append(f"{field}={shown} ({origin})")
    return f"{' and '.join(parts)}: {rule}"


def _plain(value: Any) -> str:
    if isinstance(value, float | int) and not isinstance(value, bool):
        return number(value)
    return _show(value) if not isinstance(value, str) else _cut(value)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()  # a TOML date or time
    return _cut(repr(value))


def _cut(text: str) -> str:
    text = _USERINFO.sub(r"\1***@", text)  # a URL's password is a secret too
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


_USERINFO = re.compile(r"(://[^/@\s:]*:)[^/@\s]*@")

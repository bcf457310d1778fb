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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dotenv.parser import parse_stream
from pydantic import ValidationError

from config.settings import Settings, _Relations, accepted, default_text, number

__all__ = [
    "ENV_PREFIX",
    "SettingsError",
    "UnknownSetting",
    "format_settings_error",
    "load_settings",
]

ENV_PREFIX = "GATEWAY_"
CLIENT_VARIABLES = frozenset({"GATEWAY_OPS_URL", "GATEWAY_OPS_TOKEN", "GATEWAY_COMMAND"})
"""Read by the command line (`gateway ops`'s address and token; the command hints name, which
``scripts/run`` sets), not settings of the service: never an unknown setting."""
_JSON_FIELDS = frozenset({"routes", "slack_approvers"})  # JSON in a variable, tables in TOML
_SECRET_FIELDS = frozenset(
    {
        "model_api_key",
        "slack_bot_token",
        "slack_app_token",
        "slack_signing_secret",
        "email_password",
        "email_link_secret",
        "ops_tokens",
    }
)
_ROUTES_EXAMPLE = '[{"channel":"slack","space":"C123","session":"ops"}]'
_JSON_EXAMPLES = {
    "routes": f"a JSON list of routes, like {_ROUTES_EXAMPLE}",
    "slack_approvers": 'a JSON object of channel -> approvers, like {"C0123": ["U0456", "S0789"]}',
}
_ROUTE_KEYS = "a route has channel, session and (optional, * by default) space"
_SHOWN = 80


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
) -> Settings:
    """Read and check the settings (called once, by the entry point).

    Sources, strongest first: `environ` (the process environment when None), then `env_file`
    (by default ``.env`` in the current directory if it exists, but only when `environ` is
    None: a caller who passes the environment passes all of it), then `config_file` (TOML, e.g.
    ``gateway serve --config gateway.toml``), then the defaults. Only ``GATEWAY_*`` variables
    are read; values in ``.env`` are literal (no ``${VAR}`` expansion).

    Raises:
        UnknownSetting: a ``GATEWAY_*`` variable or a TOML key names no setting.
        SettingsError: a file cannot be read or parsed, a value is empty, of the wrong type or
            out of range, or settings do not work together; ``str()`` is one line.
    """
    problems: list[str] = []
    unknown: list[str] = []
    values: dict[str, _Value] = {}
    if config_file is not None:
        values.update(_read_toml(Path(config_file), problems, unknown))
    dotenv = Path(env_file) if env_file is not None else None
    if dotenv is None and environ is None and Path(".env").is_file():
        dotenv = Path(".env")
    if dotenv is not None:
        values.update(_from_variables(_read_dotenv(dotenv), problems, unknown))
    process = os.environ if environ is None else environ
    variables = ((key, value, "the environment") for key, value in process.items())
    values.update(_from_variables(variables, problems, unknown))
    if unknown:
        raise UnknownSetting(unknown + problems)
    if problems:
        raise SettingsError(problems)
    try:
        return Settings.model_validate({name: value.value for name, value in values.items()})
    except ValidationError as exc:
        # `from None`: pydantic's error repeats every input, secrets included
        raise SettingsError(_problems(exc, values)) from None


def format_settings_error(exc: SettingsError | ValidationError) -> str:
    """One line for the command line, from a `SettingsError` or a ``Settings(...)`` error."""
    if isinstance(exc, ValidationError):
        return str(SettingsError(_problems(exc, {})))
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


def _read_toml(path: Path, problems: list[str], unknown: list[str]) -> dict[str, _Value]:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise SettingsError([f"cannot read config file {path}: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise SettingsError(
            [f"config file {path} is not UTF-8 text (byte {exc.start} cannot be decoded)"]
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError([f"config file {path} is not valid TOML: {exc}"]) from None
    lines = text.splitlines()
    values: dict[str, _Value] = {}
    for key, value in data.items():
        line = _toml_line(lines, key)
        where = f"{key} in {path}" + (f" line {line}" if line else "")
        if key not in Settings.model_fields:
            unknown.append(f"unknown setting {key!r} in {path}{_line(line)}{_hint(key, False)}")
            continue
        item_origins = tuple(
            f"routes in {path} line {lineno}"
            for lineno, text_line in enumerate(lines, 1)
            if key in _JSON_FIELDS and re.match(rf"\s*\[\[\s*{re.escape(key)}\s*\]\]", text_line)
        )
        values[key] = _Value(value, where, item_origins)
    return values


def _toml_line(lines: Sequence[str], key: str) -> int | None:
    """The line that sets top-level `key` (best effort: for messages only)."""
    name = rf"(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')"
    in_table = False
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("["):
            if re.match(rf"\[\[?\s*{name}\s*[\].]", stripped):
                return lineno
            in_table = True
        elif not in_table and re.match(rf"{name}\s*[=.]", stripped):
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
    variables: Iterable[tuple[str, str | None, str]], problems: list[str], unknown: list[str]
) -> dict[str, _Value]:
    """`(name, value, where)` of each variable -> the settings the ``GATEWAY_*`` ones set."""
    values: dict[str, _Value] = {}
    seen: dict[str, str] = {}
    for key, raw, where in variables:
        if not key.upper().startswith(ENV_PREFIX) or key.upper() in CLIENT_VARIABLES:
            continue
        name = key[len(ENV_PREFIX) :].lower()
        origin = f"{key} in {where}"
        if name not in Settings.model_fields:
            unknown.append(f"unknown setting {key} in {where}{_hint(name, True)}")
            continue
        if name in seen:
            problems.append(f"{seen[name]} and {origin} both set {name}: keep one")
            continue
        seen[name] = origin
        if raw is None or not raw.strip():
            problems.append(
                f"{origin} is set but empty: give {accepted(name)}, or unset it "
                f"(default: {default_text(name)})"
            )
        elif name in _JSON_FIELDS:
            try:
                values[name] = _Value(json.loads(raw), origin)
            except json.JSONDecodeError as exc:
                problems.append(
                    f"{origin} is not JSON ({exc.msg} at character {exc.pos + 1}): expected "
                    f"{_JSON_EXAMPLES[name]}"
                )
        else:
            values[name] = _Value(raw, origin)
    return values


def _hint(name: str, variable: bool) -> str:
    known = sorted(Settings.model_fields)
    bare = name.lower().removeprefix(ENV_PREFIX.lower())  # a TOML key spelt as a variable
    close = difflib.get_close_matches(bare, known, n=1)
    spell = (lambda field: f"{ENV_PREFIX}{field.upper()}") if variable else str
    if close:
        return f"; did you mean {spell(close[0])}?"
    return f"; known: {', '.join(spell(field) for field in known)}"


def _line(line: int | None) -> str:
    return f" line {line}" if line else ""


# --- validation errors --------------------------------------------------------------------


def _problems(exc: ValidationError, values: Mapping[str, _Value]) -> list[str]:
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        cause = error.get("ctx", {}).get("error")
        if not loc:
            if isinstance(cause, _Relations):
                lines.extend(
                    _relation(rel.fields, rel.rule, error["input"], values)
                    for rel in cause.relations
                )
            else:
                lines.append(str(cause or error["msg"]))
            continue
        field = str(loc[0])
        path = field + "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[1:]
        )
        source = values.get(field)
        origin = source.where(loc[1] if len(loc) > 1 else None) if source else "given"
        shown = "<hidden>" if field in _SECRET_FIELDS else _show(error["input"])
        kind = error["type"]
        if kind == "extra_forbidden":
            if len(loc) == 1:
                lines.append(f"unknown setting {field} ({origin}){_hint(field, False)}")
            else:
                lines.append(f"unknown key {path} ({origin}): {_ROUTE_KEYS}")
        elif kind == "missing":
            lines.append(f"{path} is missing ({origin}): {_ROUTE_KEYS}")
        elif kind == "value_error" and cause is not None:
            message = str(cause)
            if message.startswith("expected"):
                lines.append(f"{path}={shown} ({origin}): {message}")
            else:
                lines.append(f"{path} ({origin}): {message}")
        else:
            lines.append(f"{path}={shown} ({origin}): expected {_expected(loc)}")
    return lines


def _expected(loc: tuple[int | str, ...]) -> str:
    field = str(loc[0])
    if field == "routes" and len(loc) == 2:
        return 'a route {"channel", "space", "session"}'
    if field not in Settings.model_fields or len(loc) > 2:
        return "text"  # a route's channel, space or session (or a `Route(...)` of its own)
    return accepted(field)


def _relation(fields: tuple[str, ...], rule: str, given: Any, values: Mapping[str, _Value]) -> str:
    parts = []
    for field in fields:
        value = given.get(field) if isinstance(given, Mapping) else None
        if value is None:
            value = Settings.model_fields[field].default
        source = values.get(field)
        origin = (
            source.origin
            if source
            else ("given" if isinstance(given, Mapping) and field in given else "default")
        )
        if value is None:
            shown = "unset"
        elif field in _SECRET_FIELDS:
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

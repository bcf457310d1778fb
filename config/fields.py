"""What settings models share: relation errors, words for what a field accepts, URL and host rules.

`Settings` (the core) and every channel's `Section` use these, so a channel's section reads,
fails and documents itself exactly like the core settings do.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal, get_args, get_origin
from urllib.parse import SplitResult, urlsplit

from pydantic import BaseModel, SecretStr

__all__ = [
    "EMAIL",
    "HOSTNAME",
    "Relation",
    "Relations",
    "accepted_in",
    "check_http_url",
    "check_tokens",
    "check_url",
    "comma_separated",
    "default_text_in",
    "ip_or_none",
    "is_host",
    "is_loopback",
    "number",
    "scheme",
    "token_text",
]

EMAIL = re.compile(r"[^@\s<>,;]{1,64}@[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


class Relation(ValueError):
    """Settings that are each valid but do not work together (each check names its fields)."""

    def __init__(self, fields: tuple[str, ...], rule: str) -> None:
        super().__init__(f"{', '.join(fields)}: {rule}")
        self.fields = fields
        self.rule = rule


class Relations(ValueError):
    """Every relation check that failed (raised once by a model; the loader expands it)."""

    def __init__(self, relations: list[Relation]) -> None:
        super().__init__("; ".join(str(relation) for relation in relations))
        self.relations = relations


def accepted_in(model: type[BaseModel], name: str, words: dict[str, str] | None = None) -> str:
    """What field `name` of `model` accepts, in words (for error messages and the examples).

    The words come from `words`, else the field's ``json_schema_extra={"accepts": ...}``, else
    from its type and bounds.
    """
    if words and name in words:
        return words[name]
    field = model.model_fields[name]
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("accepts"), str):
        return str(extra["accepts"])
    annotation = field.annotation
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(str(choice) for choice in get_args(annotation))
    if annotation is bool:
        return "true or false"
    kinds = (annotation, *get_args(annotation))
    if int in kinds:
        kind = "an integer"
    elif float in kinds:
        kind = "a number of seconds" if name.endswith("_seconds") else "a number"
    else:
        return _text_rule(field.metadata)
    bounds = {
        attr: getattr(bound, attr)
        for bound in field.metadata
        for attr in ("ge", "gt", "le", "lt")
        if getattr(bound, attr, None) is not None
    }
    if "ge" in bounds and "le" in bounds:
        return f"{kind} from {number(bounds['ge'])} to {number(bounds['le'])}"
    limits = " and ".join(f"{_BOUNDS[attr]} {number(value)}" for attr, value in bounds.items())
    return f"{kind} {limits}" if limits else kind


_BOUNDS = {"ge": "at least", "gt": "above", "le": "at most", "lt": "below"}


def _text_rule(metadata: list[Any]) -> str:
    """Text, and how long it may be (``text of 1 to 100 characters``)."""
    shortest = next((m.min_length for m in metadata if getattr(m, "min_length", None)), None)
    longest = next((m.max_length for m in metadata if getattr(m, "max_length", None)), None)
    if shortest is not None and longest is not None:
        return f"text of {shortest} to {longest} characters"
    if longest is not None:
        return f"text of at most {longest} characters"
    if shortest == 1:
        return "text (not empty)"
    return f"text of at least {shortest} characters" if shortest is not None else "text"


def default_text_in(model: type[BaseModel], name: str) -> str:
    """Field `name`'s default as a person writes it (``unset`` when it has none).

    A field whose default means more than its value says it in ``json_schema_extra=
    {"default_text": ...}`` (no operator tokens: a local one is made).
    """
    extra = model.model_fields[name].json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("default_text"), str):
        return str(extra["default_text"])
    default = model.model_fields[name].get_default(call_default_factory=True)
    if default is None:
        return "unset"
    if default in ((), {}):
        return "none"
    if isinstance(default, bool):
        return "true" if default else "false"
    return number(default) if isinstance(default, float | int) else str(default)


def number(value: float) -> str:
    """`value` as a person writes it: 30, 0.5, 86400 (no exponent, no trailing .0)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def check_url(value: str, schemes: tuple[str, ...], wanted: str) -> str:
    """`value` if its scheme is one of `schemes`; else ValueError ``expected <wanted>``."""
    if scheme(value) not in schemes or not value.partition("://")[1]:
        raise ValueError(f"expected {wanted}")
    return value


_UNSENDABLE = re.compile(r"[\s\x00-\x1f\x7f]")
"""What no URL a request is sent to holds: a space or a control character (a line end a file
or a secret store left on the value)."""


def check_http_url(value: str, wanted: str, *, query: bool = True) -> SplitResult:
    """`value`'s parts, if it is an http(s) URL a request can be sent to; else ValueError.

    It must have a host, a port (if any) from 1 to 65535, no ``#fragment``, no space or control
    character, and no query unless `query`. Each was found only when the first request failed
    (an outside probe): a port of 99999 stopped the service at its banner, a line end made every
    reply a dead letter hours later, a status URL's query took the id the gateway appends.
    """
    check_url(value, ("http", "https"), wanted)
    if _UNSENDABLE.search(value):
        raise ValueError(f"expected {wanted}, without spaces or control characters")
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = 0
    if not parts.hostname or port == 0:
        raise ValueError(f"expected {wanted} with a host (and a port from 1 to 65535)")
    if parts.fragment or (parts.query and not query):
        no = "no #fragment" if query else "no ?query or #fragment"
        raise ValueError(f"expected {wanted} with {no}")
    return parts


def scheme(url: str) -> str:
    """A URL's scheme, lower case (``""`` when it has none)."""
    return url.partition("://")[0].lower()


def ip_or_none(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`text` as an IP address, or None when it is not one."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def is_host(text: str) -> bool:
    """Whether `text` is an IP address or a host name (no scheme, no port, no wildcard)."""
    return ip_or_none(text) is not None or HOSTNAME.fullmatch(text) is not None


def comma_separated(value: Any) -> Any:
    """A variable's comma-separated text as a tuple of its parts; any other value as it is."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


_TOKEN_NAME = re.compile(r"[a-z0-9._-]{1,64}")


def token_text(value: Any, form: str) -> Any:
    """A tokens setting before validation: a variable's comma-separated text as a tuple.

    Raises:
        ValueError: only commas (`form` names what a token is, like ``name:secret``).
    """
    if isinstance(value, str) and value.strip() and not comma_separated(value):
        raise ValueError(f"names no token (only commas): give {form}, or unset it")
    return comma_separated(value)


def check_tokens(
    value: tuple[SecretStr, ...], roles: tuple[str, ...] | None = None
) -> tuple[SecretStr, ...]:
    """Named tokens, ``name:secret`` (or ``name:role:secret`` with `roles`), checked.

    A name is 1-64 of a-z 0-9 . _ -; a secret is 24+ printable characters, no spaces; names
    and secrets are unique. The errors name the token by its place and name, never its secret.

    Raises:
        ValueError: one token is not so.
    """
    form = "name:secret" if roles is None else "name:role:secret"
    names: set[str] = set()
    secrets: set[str] = set()
    for position, token in enumerate(value):
        parts = token.get_secret_value().split(":", 1 if roles is None else 2)
        where = f"token {position + 1}"
        if len(parts) != (2 if roles is None else 3):
            raise ValueError(f"{where}: expected {form}")
        name, secret = parts[0], parts[-1]
        if not _TOKEN_NAME.fullmatch(name):
            raise ValueError(f"{where}: the name must be 1-64 of a-z 0-9 . _ -")
        if roles is not None and parts[1] not in roles:
            raise ValueError(f"{where} ({name}): the role must be {' or '.join(roles)}")
        if len(secret) < 24 or not secret.isprintable() or " " in secret:
            raise ValueError(
                f"{where} ({name}): the secret must be 24+ printable characters, no spaces"
            )
        if name in names or secret in secrets:
            raise ValueError(f"{where} ({name}): names and secrets must be unique")
        names.add(name)
        secrets.add(secret)
    return value


def is_loopback(host: str) -> bool:
    """Whether `host` is ``localhost`` or a loopback address (only this machine reaches it)."""
    address = ip_or_none(host)
    return host == "localhost" or (address is not None and address.is_loopback)

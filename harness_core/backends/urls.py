"""Backend URLs, written once: one parser per family and the opener registry of each thing.

A family names its schemes once and parses its URLs (`MemoryUrls`, `SqliteUrls`, `JsonlUrls`,
`RedisUrls`); each thing kept in a backend (the session store, the broker, the web mailbox)
has an `Openers` registry where it adds, per family it supports, the family's URL form (with
the thing's options and defaults) and its opener. Paths follow SQLAlchemy's convention: three
slashes and a relative path, four for an absolute one.

Every refusal is raised before anything is created or contacted, as the thing's own error
(`Refuse`: the registry's owner builds it, naming the forms it accepts), on one line: the URL
is shown without its password (`shown`) and cut if it is long.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar
from urllib.parse import parse_qs, urlsplit, urlunsplit

__all__ = [
    "JsonlUrls",
    "MemoryUrl",
    "MemoryUrls",
    "Openers",
    "PathUrl",
    "REDIS_SCHEMES",
    "RedisUrl",
    "RedisUrls",
    "Refuse",
    "shown",
    "SqliteUrls",
    "UrlForm",
    "userinfo_password",
    "without_password",
]

Refuse = Callable[[str, str | None], Exception]
"""(url, why) -> the error a thing raises for a URL it refuses (``why`` None: an unsupported
scheme); the message names the forms the thing accepts."""

REDIS_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster")
"""A server (``rediss``: TLS), or a Redis Cluster through one startup node (``+cluster``)."""

_SHOWN_LENGTH = 200
"""The longest URL a message shows whole (a longer one is cut, its length said)."""
_PART_LENGTH = 60
"""The longest option name or value a message quotes whole."""

_T = TypeVar("_T")
_A = TypeVar("_A")
_L = TypeVar("_L")
_V = TypeVar("_V")
_L_co = TypeVar("_L_co", covariant=True)
_DATABASE = re.compile(r"/?|/[0-9]+")
_CLUSTER_DATABASE = re.compile(r"/?|/0")


def userinfo_password(url: str) -> str | None:
    """The password in `url`'s userinfo as written (percent-encoded or not), if it has one.

    Read up to the last ``@``, not as `urlsplit` reads it: a password left unencoded (``#``,
    ``@``, ``/`` in a generated one) ended the netloc early, so ``redis://:secr#et@host`` had
    no password to hide and was printed whole, ``redis://:p@ss@host`` all but its first
    character (an outside probe). A URL with an ``@`` in its path or query may have more of
    it taken for a password: hidden too much, never too little.
    """
    _, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0:
        return None
    _, colon, password = rest[:at].partition(":")
    return password if colon and password else None


def without_password(url: str) -> str:
    """`url` with its password shown as ``***`` (for messages and logs)."""
    password = userinfo_password(url)
    if password is None:
        return url
    scheme, _, rest = url.partition("://")
    at = rest.rfind("@")
    user = rest[:at].partition(":")[0]
    return f"{scheme}://{user}:***{rest[at:]}"


def shown(url: str) -> str:
    """`url` as a message shows it: without its password, quoted, cut past `_SHOWN_LENGTH`."""
    return _quoted(without_password(url), _SHOWN_LENGTH)


def _quoted(text: str, limit: int = _PART_LENGTH) -> str:
    """`text` quoted on one line (``repr``), cut past `limit` characters, its length said."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


@dataclass(frozen=True)
class MemoryUrl:
    """``memory://``: in this process only."""


@dataclass(frozen=True)
class PathUrl:
    """A file or directory URL: its path (relative to the current directory, or absolute)."""

    path: str
    options: Mapping[str, str]
    """The query options given (each one the form allows)."""


@dataclass(frozen=True)
class RedisUrl:
    """A Redis URL: the server to connect to, whether it is a cluster, the key prefix."""

    server: str
    """``redis://`` or ``rediss://`` (TLS), host, port and database: no ``+cluster``, no query."""
    cluster: bool
    prefix: str


class UrlForm(Protocol[_L_co]):
    """A family's URL form: the schemes it takes and its parser (the thing's options included)."""

    @property
    def schemes(self) -> tuple[str, ...]:
        """The URL schemes of the family (registered once, by the family)."""
        ...

    def parse(self, url: str, refuse: Refuse) -> _L_co:
        """`url` (of one of `schemes`) parsed, or ``refuse(url, why)`` raised."""
        ...


def _options(url: str, allowed: Mapping[str, tuple[str, ...]], refuse: Refuse) -> dict[str, str]:
    """The URL's query options, each known and (where `allowed` lists values) valid."""
    parts = urlsplit(url)
    if parts.fragment:
        raise refuse(url, "a fragment (#...) is not allowed")
    options: dict[str, str] = {}
    for key, values in parse_qs(parts.query, keep_blank_values=True).items():
        if key not in allowed:
            raise refuse(url, f"unknown option {_quoted(key)} (known: {sorted(allowed)})")
        value = values[-1]  # given twice: the last one counts
        if allowed[key] and value not in allowed[key]:
            raise refuse(url, f"{key} must be one of {allowed[key]}, got {_quoted(value)}")
        options[key] = value
    return options


def _is_dir(url: str, path: Path, refuse: Refuse) -> bool | None:
    """Whether `path` is a directory (None: nothing is there); a path the OS refuses is refused."""
    try:
        return path.is_dir() if path.exists() else None
    except (OSError, ValueError) as exc:  # too long, a NUL byte, no permission to look
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise refuse(url, f"the path cannot be used: {reason}") from None


def _path(url: str, scheme: str, refuse: Refuse, *, directory: bool, memory_ok: bool) -> str:
    """The file-system path of a file or directory URL, refused unless it names one.

    Nothing is created here: a URL that would put data in the current directory by accident
    (an empty path), at the file-system root, or on top of something of the wrong kind (a file
    where a directory belongs, or the reverse) is refused. ``:memory:`` is accepted only when
    `memory_ok`.
    """
    location = url[len(scheme) + 3 :].split("?", 1)[0]  # after "scheme://"
    if not location.startswith("/"):
        raise refuse(url, f"expected {scheme}:///relative or {scheme}:////absolute (no host)")
    path = location[1:]
    if path == ":memory:" and memory_ok:
        return path
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in path):
        raise refuse(url, "the path holds a control character (a line break, a tab...)")
    if directory:
        path = path.rstrip("/") or path
    if not path or path.endswith("/") or not Path(path).name or path == ":memory:":
        kind = "directory" if directory else "database file"
        raise refuse(url, f"the path does not name a {kind}")
    target = Path(path)
    is_dir = _is_dir(url, target, refuse)
    if is_dir is not None and is_dir != directory:
        raise refuse(url, f"{path} is {'not ' if directory else ''}a directory")
    for ancestor in target.parents:
        ancestor_is_dir = _is_dir(url, ancestor, refuse)
        if ancestor_is_dir is not None:
            if not ancestor_is_dir:
                raise refuse(url, f"{ancestor} is not a directory")
            break
    return path


@dataclass(frozen=True)
class MemoryUrls:
    """``memory://``: no host, path or option."""

    schemes: ClassVar[tuple[str, ...]] = ("memory",)

    def parse(self, url: str, refuse: Refuse) -> MemoryUrl:
        """`MemoryUrl`, or refused."""
        if url.partition("://")[2].split("?", 1)[0]:
            raise refuse(url, "memory:// takes no host or path")
        _options(url, {}, refuse)
        return MemoryUrl()


@dataclass(frozen=True, kw_only=True)
class SqliteUrls:
    """``sqlite:///relative.db`` or ``sqlite:////absolute.db``, with the thing's `options`."""

    schemes: ClassVar[tuple[str, ...]] = ("sqlite",)
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Option name -> its accepted values (empty: any value)."""
    memory_ok: bool = False
    """Whether ``sqlite:///:memory:`` (a database in this process only) is accepted."""

    def parse(self, url: str, refuse: Refuse) -> PathUrl:
        """The database file's path and the options, or refused."""
        path = _path(url, "sqlite", refuse, directory=False, memory_ok=self.memory_ok)
        return PathUrl(path, _options(url, self.options, refuse))


@dataclass(frozen=True, kw_only=True)
class JsonlUrls:
    """``jsonl:///relative/dir`` or ``jsonl:////absolute/dir``, with the thing's `options`."""

    schemes: ClassVar[tuple[str, ...]] = ("jsonl",)
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Option name -> its accepted values (empty: any value)."""

    def parse(self, url: str, refuse: Refuse) -> PathUrl:
        """The directory's path and the options, or refused."""
        path = _path(url, "jsonl", refuse, directory=True, memory_ok=False)
        return PathUrl(path, _options(url, self.options, refuse))


@dataclass(frozen=True, kw_only=True)
class RedisUrls:
    """``redis://host:port/db`` or ``redis+cluster://host:port``, with ``?prefix=``.

    ``rediss://`` and ``rediss+cluster://`` for TLS; the prefix defaults to `default_prefix`. A
    host is required; a port is a number from 1 to 65535; the path is empty or a database
    number (a cluster has database 0 only); the prefix follows `KeySpace`'s rule.
    """

    schemes: ClassVar[tuple[str, ...]] = REDIS_SCHEMES
    default_prefix: str

    def parse(self, url: str, refuse: Refuse) -> RedisUrl:
        """The server, whether it is a cluster, and the key prefix; or refused."""
        scheme = url.partition("://")[0]
        base, _, variant = scheme.partition("+")
        cluster = variant == "cluster"
        parts = urlsplit(url)
        password = userinfo_password(url) or ""
        if any(c in password for c in "@#/?"):  # read as the host's, the port's or a path's
            raise refuse(
                url,
                "its password holds @, #, / or ?: write them percent-encoded (%40, %23, %2F, %3F)",
            )
        try:
            port = parts.port
        except ValueError:
            raise refuse(url, "the port must be a number from 1 to 65535") from None
        if port is not None and not 1 <= port <= 65535:
            raise refuse(url, "the port must be a number from 1 to 65535")
        if not parts.hostname:
            raise refuse(url, "a host is required")
        if parts.fragment:
            raise refuse(url, "a fragment (#...) is not allowed")
        if cluster and not _CLUSTER_DATABASE.fullmatch(parts.path):
            raise refuse(url, "a Redis Cluster has database 0 only: the path must be empty or /0")
        if not _DATABASE.fullmatch(parts.path):
            raise refuse(url, "the path must be empty or a database number, like /0")
        prefix = _options(url, {"prefix": ()}, refuse).get("prefix") or self.default_prefix
        from harness_core.backends.redis import KeySpace  # the key rule (imports redis-py)

        try:
            KeySpace(prefix)
        except ValueError as exc:
            raise refuse(url, str(exc)) from None
        return RedisUrl(urlunsplit((base, parts.netloc, parts.path, "", "")), cluster, prefix)


class Openers(Generic[_T, _A]):
    """Where one thing opens from a URL: per family it supports, the URL form and an opener.

    `add` registers a family's form (its schemes, its parser with the thing's options and
    defaults) with an opener taking the parsed URL and the thing's arguments (`_A`: a clock,
    ids...). `open` parses and opens; it refuses with the thing's own error (`refuse`) a URL
    without a scheme, of a scheme no family here takes, or one its family's parser refuses.
    """

    def __init__(self, refuse: Refuse) -> None:
        self.refuse = refuse
        self._openers: dict[str, Callable[[str, _A], _T]] = {}
        self._forms: dict[str, UrlForm[object]] = {}

    @property
    def schemes(self) -> tuple[str, ...]:
        """Every scheme this thing opens, in the order registered."""
        return tuple(self._openers)

    def add(self, form: UrlForm[_L], opener: Callable[[_L, _A], _T]) -> None:
        """Open URLs of `form`'s schemes with `opener`.

        Raises:
            ValueError: one of its schemes has an opener already.
        """

        def open_url(url: str, args: _A) -> _T:
            return opener(form.parse(url, self.refuse), args)

        taken = [scheme for scheme in form.schemes if scheme in self._openers]
        if taken:
            raise ValueError(f"scheme(s) {taken} already have an opener")
        for scheme in form.schemes:
            self._openers[scheme] = open_url
            self._forms[scheme] = form

    def check(self, url: str) -> None:
        """Refuse `url` as `open` would, building nothing (a setting checked at start).

        Raises:
            Exception: ``refuse(url, why)`` for a URL no registered form accepts.
        """
        self._of(url, self._forms).parse(url, self.refuse)

    def open(self, url: str, args: _A) -> _T:
        """What `url` names, opened with `args` (nothing is created or contacted here).

        Raises:
            Exception: ``refuse(url, why)`` for a URL no registered form accepts.
        """
        return self._of(url, self._openers)(url, args)

    def _of(self, url: str, by_scheme: Mapping[str, _V]) -> _V:
        """What `by_scheme` holds for `url`'s scheme; ``refuse(url, None)`` if nothing."""
        scheme, separator, _ = url.partition("://")
        found = by_scheme.get(scheme) if separator else None
        if found is None:
            raise self.refuse(url, None)
        return found

"""Backend URL rules shared by `open_repo` and the gateway's `open_broker` (one set of checks).

Each opener names its own error: it passes `refuse(url, why)`, which builds the exception to
raise (``why`` None: the scheme itself is unsupported), so the messages name the right forms.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

__all__ = ["Refuse", "UrlRules", "without_password"]

Refuse = Callable[[str, str | None], Exception]
"""(url, why) -> the error an opener raises for a URL it refuses."""

_PREFIX = re.compile(r"[^{}\s]+")  # matched whole: ``$`` would take a trailing newline


def without_password(url: str) -> str:
    """`url` with its password shown as ``***`` (for messages and logs; unparsable: unchanged)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class UrlRules:
    """Checks on a backend URL's path, options, Redis server and key prefix."""

    def __init__(self, refuse: Refuse) -> None:
        self.refuse = refuse

    def path(self, url: str, scheme: str, *, directory: bool, memory_ok: bool = False) -> str:
        """The file-system path of a ``jsonl``/``sqlite`` URL, refused unless it names one.

        Nothing is created here: a URL that would put a store in the current directory by
        accident (an empty path), at the file-system root, or on top of something of the wrong
        kind (a file where a directory belongs, or the reverse) is refused before any backend
        exists. ``:memory:`` is accepted only when `memory_ok`.
        """
        location = url[len(scheme) + 3 :].split("?", 1)[0]  # after "scheme://"
        if not location.startswith("/"):
            raise self.refuse(
                url, f"expected {scheme}:///relative or {scheme}:////absolute (no host)"
            )
        path = location[1:]
        if path == ":memory:" and memory_ok:
            return path
        if directory:
            path = path.rstrip("/") or path
        if not path or path.endswith("/") or not Path(path).name or path == ":memory:":
            kind = "directory" if directory else "database file"
            raise self.refuse(url, f"the path does not name a {kind}")
        target = Path(path)
        if target.exists() and target.is_dir() != directory:
            raise self.refuse(url, f"{path} is {'not ' if directory else ''}a directory")
        for ancestor in target.parents:
            if ancestor.exists():
                if not ancestor.is_dir():
                    raise self.refuse(url, f"{ancestor} is not a directory")
                break
        return path

    def options(self, url: str, allowed: dict[str, tuple[str, ...]]) -> dict[str, str]:
        """The URL's query options, each known and (where `allowed` lists values) valid."""
        parts = urlsplit(url)
        if parts.fragment:
            raise self.refuse(url, "a fragment (#...) is not allowed")
        options: dict[str, str] = {}
        for key, values in parse_qs(parts.query, keep_blank_values=True).items():
            if key not in allowed:
                raise self.refuse(url, f"unknown option {key!r} (known: {sorted(allowed)})")
            value = values[-1]
            if allowed[key] and value not in allowed[key]:
                raise self.refuse(url, f"{key} must be one of {allowed[key]}, got {value!r}")
            options[key] = value
        return options

    def redis_server(self, url: str, *, scheme: str, cluster: bool) -> str:
        """The server part of a redis URL under `scheme`, refused unless host, port, db are sane.

        A cluster's database is 0 (an empty path or ``/0``).
        """
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise self.refuse(url, "the port must be a number from 1 to 65535") from None
        if port is not None and not 1 <= port <= 65535:
            raise self.refuse(url, "the port must be a number from 1 to 65535")
        if not parts.hostname:
            raise self.refuse(url, "a host is required")
        if parts.fragment:
            raise self.refuse(url, "a fragment (#...) is not allowed")
        if cluster and not re.fullmatch(r"/?|/0", parts.path):
            raise self.refuse(
                url, "a Redis Cluster has database 0 only: the path must be empty or /0"
            )
        if not re.fullmatch(r"/?|/\d+", parts.path):
            raise self.refuse(url, "the path must be empty or a database number, like /0")
        return urlunsplit((scheme, parts.netloc, parts.path, "", ""))

    def prefix(self, url: str, default: str) -> str:
        """The ``?prefix=`` of a redis URL (no braces or spaces: they would break hash tags)."""
        prefix = self.options(url, {"prefix": ()}).get("prefix") or default
        if not _PREFIX.fullmatch(prefix):
            raise self.refuse(url, f"invalid redis key prefix {prefix!r} (no braces or spaces)")
        return prefix

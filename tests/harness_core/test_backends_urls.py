"""Backend URLs: one parser per family and the opener registry the store, the broker and the web
mailbox share; every edge form is refused in one clear line, before anything is created."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapters.web import MailboxError, open_mailbox
from gateway.broker import BrokerError, open_broker
from harness_core.backends.urls import (
    JsonlUrls,
    MemoryUrl,
    MemoryUrls,
    Openers,
    PathUrl,
    RedisUrl,
    RedisUrls,
    SqliteUrls,
    shown,
    without_password,
)
from harness_core.errors import SessionError
from harness_core.storage import open_repo

ACCEPTED = "accepted thing URLs: memory://, sqlite:///x.db, jsonl:///dir, redis://host/0"


class Refused(Exception):
    """The thing's own error."""


def _refuse(url: str, why: str | None) -> Refused:
    what = f"thing URL {shown(url)}: {why}" if why else f"unsupported thing URL {shown(url)}"
    return Refused(f"{what}; {ACCEPTED}")


def _thing(opened: list[object] | None = None) -> Openers[Any, str]:
    """A thing opening all four families; an opener returns what it was given (and adds it to
    `opened`)."""

    def opener(url: object, given: str) -> tuple[object, str]:
        if opened is not None:
            opened.append(url)
        return url, given

    things: Openers[Any, str] = Openers(_refuse)
    things.add(MemoryUrls(), opener)
    things.add(SqliteUrls(options={"synchronous": ("normal", "full")}), opener)
    things.add(JsonlUrls(options={"fsync": ()}), opener)
    things.add(RedisUrls(default_prefix="gwt"), opener)
    return things


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("")


# -- accepted ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("memory://", MemoryUrl()),
        ("sqlite:///x.db", PathUrl("x.db", {})),
        ("sqlite:///data/x.db", PathUrl("data/x.db", {})),  # relative: under the current dir
        ("sqlite:///../x.db", PathUrl("../x.db", {})),
        ("sqlite:////var/lib/gw/x.db", PathUrl("/var/lib/gw/x.db", {})),  # absolute
        ("sqlite:///x.db?", PathUrl("x.db", {})),
        ("sqlite:///x.db?synchronous=full", PathUrl("x.db", {"synchronous": "full"})),
        (
            "sqlite:///x.db?synchronous=full&synchronous=normal",  # the last one counts
            PathUrl("x.db", {"synchronous": "normal"}),
        ),
        ("jsonl:///sessions/", PathUrl("sessions", {})),
        ("jsonl:///a-dir?fsync=anything", PathUrl("a-dir", {"fsync": "anything"})),
        ("redis://h", RedisUrl("redis://h", False, "gwt")),
        ("rediss://u:pw@h:6380/2?prefix=a:b", RedisUrl("rediss://u:pw@h:6380/2", False, "a:b")),
        ("redis+cluster://h:7000", RedisUrl("redis://h:7000", True, "gwt")),
        ("rediss+cluster://h:7000/0", RedisUrl("rediss://h:7000/0", True, "gwt")),
        ("redis://[::1]:6379/0", RedisUrl("redis://[::1]:6379/0", False, "gwt")),
    ],
)
def test_each_family_parses_its_forms(url: str, parsed: object, tmp_path: Path) -> None:
    assert _thing().open(url, "given") == (parsed, "given")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir", "a-file"]  # nothing made


# -- refused, in one line ------------------------------------------------------------------------

_HUGE = "a" * 5000

REFUSED = {
    # no scheme, an unknown one
    "empty": ("", "unsupported thing URL ''"),
    "only a separator": ("://", "unsupported thing URL '://'"),
    "no separator": ("sqlite:x.db", "unsupported thing URL 'sqlite:x.db'"),
    "a bare path": ("/var/lib/x.db", "unsupported thing URL '/var/lib/x.db'"),
    "unknown scheme": ("postgres://h/db", "unsupported thing URL 'postgres://h/db'"),
    "schemes are exact": ("SQLITE:///x.db", "unsupported thing URL 'SQLITE:///x.db'"),
    # paths
    "a host": ("sqlite://x.db", "expected sqlite:///relative or sqlite:////absolute (no host)"),
    "empty path": ("sqlite:///", "the path does not name a database file"),
    "root": ("sqlite:////", "the path does not name a database file"),
    "a directory's form": ("sqlite:///data/", "the path does not name a database file"),
    "a directory": ("sqlite:///a-dir", "a-dir is a directory"),
    "under a file": ("sqlite:///a-file/x.db", "a-file is not a directory"),
    "a file for a dir": ("jsonl:///a-file", "a-file is not a directory"),
    "memory only here": ("sqlite:///:memory:", "the path does not name a database file"),
    "a line break": ("sqlite:///x.db\n", "the path holds a control character"),
    "a NUL": ("sqlite:///x\x00.db", "the path holds a control character"),
    "huge path": (f"sqlite:///{_HUGE}.db", "the path cannot be used: File name too long"),
    "memory path": ("memory://x", "memory:// takes no host or path"),
    # query strings
    "unknown option": ("sqlite:///x.db?mode=ro", "unknown option 'mode' (known: ['synchronous'])"),
    "blank value": ("sqlite:///x.db?synchronous", "synchronous must be one of"),
    "bad value": ("sqlite:///x.db?synchronous=off", "synchronous must be one of"),
    "memory option": ("memory://?x=1", "unknown option 'x' (known: [])"),
    "fragment": ("sqlite:///x.db#top", "a fragment (#...) is not allowed"),
    "huge option": (f"sqlite:///x.db?{_HUGE}=1", "unknown option 'aaaa"),
    "huge value": (f"sqlite:///x.db?synchronous={_HUGE}", "(5000 characters)"),
    # redis servers
    "no host": ("redis:///0", "a host is required"),
    "scheme only": ("redis://", "a host is required"),
    "bad database": ("redis://h/zero", "the path must be empty or a database number"),
    "negative db": ("redis://h/-1", "the path must be empty or a database number"),
    "extra path": ("redis://h/0/x", "the path must be empty or a database number"),
    "arabic digit db": ("redis://h/\u0663", "the path must be empty or a database number"),
    "cluster db": ("redis+cluster://h:1/1", "a Redis Cluster has database 0 only"),
    "redis option": ("redis://h/0?db=1", "unknown option 'db' (known: ['prefix'])"),
    "prefix brace": ("redis://h/0?prefix=a{b}", "invalid redis key prefix 'a{b}'"),
    "prefix space": ("redis://h/0?prefix=a%20b", "invalid redis key prefix 'a b'"),
}
_PORTS = [
    "nan",
    "NaN",
    "inf",
    "-1",
    "+1",
    "1e3",
    "0x1f",
    "6379.0",
    "\u0663",
    "0",
    "65536",
    "9" * 30,
]
for _port in _PORTS:
    REFUSED[f"port {_port[:8]}"] = (
        f"redis://h:{_port}/0",
        "the port must be a number from 1 to 65535",
    )


@pytest.mark.parametrize(("url", "why"), REFUSED.values(), ids=REFUSED.keys())
def test_an_edge_form_is_refused_in_one_clear_line(url: str, why: str, tmp_path: Path) -> None:
    with pytest.raises(Refused) as refused:
        _thing().open(url, "given")
    message = str(refused.value)
    assert why in message
    assert message.endswith(f"; {ACCEPTED}")
    assert "\n" not in message and len(message) < 700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir", "a-file"]


@pytest.mark.parametrize(("url", "why"), REFUSED.values(), ids=REFUSED.keys())
def test_a_check_refuses_as_open_does_and_builds_nothing(url: str, why: str) -> None:
    """What the settings check at start (D377): the same refusal, no opener called."""
    opened: list[object] = []
    things = _thing(opened)
    with pytest.raises(Refused) as checked:
        things.check(url)
    assert why in str(checked.value)
    things.check("sqlite:///fine.db")
    things.check("redis://h:6379/0")
    assert opened == []
    things.open("sqlite:///fine.db", "given")
    assert len(opened) == 1  # the openers are the ones `open` calls


def test_a_refusal_never_shows_the_password() -> None:
    with pytest.raises(Refused) as refused:
        _thing().open("rediss://user:hunter2@h:99999/0", "given")
    assert "hunter2" not in str(refused.value) and "user:***@h" in str(refused.value)


# -- the registry --------------------------------------------------------------------------------


def test_a_scheme_has_one_opener() -> None:
    things = _thing()
    assert things.schemes == (
        "memory", "sqlite", "jsonl", "redis", "rediss", "redis+cluster", "rediss+cluster",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"scheme\(s\) \['sqlite'\] already have an opener"):
        things.add(SqliteUrls(), lambda url, given: None)


_THINGS: dict[str, tuple[Callable[[str], object], type[Exception], str]] = {
    "store": (open_repo, SessionError, "accepted store URLs: "),
    "broker": (open_broker, BrokerError, "accepted broker URLs: "),
    "mailbox": (open_mailbox, MailboxError, "accepted web mailbox URLs: "),
}


@pytest.mark.parametrize("thing", _THINGS, ids=_THINGS.keys())
@pytest.mark.parametrize(
    "url",
    [
        "",
        "sqlite:///",
        "sqlite:///x.db?mode=ro",
        f"sqlite:///{_HUGE}.db",
        "redis://:hunter2@h:nan/0",
        "redis://h/0?prefix=a{b}",
        "postgres://h/db",
    ],
)
def test_the_store_the_broker_and_the_mailbox_refuse_alike(thing: str, url: str) -> None:
    """One parser: the same URL is refused by all three, each in its own words and error."""
    opener, error, accepted = _THINGS[thing]
    with pytest.raises(error) as refused:
        opener(url)
    message = str(refused.value)
    assert accepted in message and "\n" not in message and "hunter2" not in message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:secr#et@127.0.0.1:16401/0", "redis://:***@127.0.0.1:16401/0"),
        ("redis://:p@ss:w/rd#1%?x@127.0.0.1:16401/0", "redis://:***@127.0.0.1:16401/0"),
        ("redis://ann:p%40ss@h:1/0", "redis://ann:***@h:1/0"),
        ("redis://ann@h:1/0", "redis://ann@h:1/0"),
        ("redis://h:1/0", "redis://h:1/0"),
    ],
)
def test_a_password_left_unencoded_is_hidden_whole(url: str, shown: str) -> None:
    """A `#` ended the netloc as `urlsplit` reads it, so the password was printed whole; an
    `@` left all but its first character (an outside probe): read up to the last `@` now."""
    assert without_password(url) == shown
    password = url.partition("://")[2].rpartition("@")[0].partition(":")[2]
    if not any(c in password for c in "@#/?"):
        return
    with pytest.raises(SessionError) as refused:
        open_repo(url)
    said = str(refused.value)
    assert password not in said and password[1:] not in said
    assert "write them percent-encoded (%40, %23, %2F, %3F)" in said

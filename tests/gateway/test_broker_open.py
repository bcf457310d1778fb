"""`open_broker(url)`: the accepted URL forms, and refusals that create nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.broker import ACCEPTED_BROKER_URLS, open_broker
from gateway.broker.contract import BrokerError, NewInboxItem
from gateway.broker.sqlite import SqliteBroker
from harness_core.testing import ManualClock


def _item() -> NewInboxItem:
    return NewInboxItem(session="s1", lane="web:t", dedupe_key="k", kind="message", payload={})


async def test_three_slashes_is_relative_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    broker = open_broker("sqlite:///.gateway/broker.db", clock=ManualClock())
    assert isinstance(broker, SqliteBroker)
    assert not (tmp_path / ".gateway").exists()  # nothing is created before first use
    await broker.inbox.append(_item())
    await broker.close()
    assert (tmp_path / ".gateway" / "broker.db").is_file()


async def test_four_slashes_is_absolute_and_options_are_read(tmp_path: Path) -> None:
    broker = open_broker(
        f"sqlite:///{tmp_path}/b.db?synchronous=full",
        visibility_timeout_ms=1_234,
        dedupe_ttl_ms=5_678,
    )
    assert isinstance(broker, SqliteBroker)
    assert broker.path == tmp_path / "b.db"
    assert (broker.visibility_timeout_ms, broker.dedupe_ttl_ms) == (1_234, 5_678)
    await broker.close()


_REFUSED = {
    "no_scheme": "broker.db",
    "unknown_scheme": "postgres://localhost/db",
    "memory": "memory://",
    "sqlite_host": "sqlite://host/broker.db",
    "sqlite_empty_path": "sqlite:///",
    "sqlite_directory_path": "sqlite:///dir/",
    "sqlite_in_memory": "sqlite:///:memory:",
    "sqlite_unknown_option": "sqlite:///b.db?fsync=always",
    "sqlite_bad_synchronous": "sqlite:///b.db?synchronous=off",
    "sqlite_fragment": "sqlite:///b.db#x",
    "redis_no_host": "redis:///0",
    "redis_bad_port": "redis://localhost:99999/0",
    "redis_port_not_a_number": "redis://localhost:x/0",
    "redis_bad_db": "redis://localhost:6379/zero",
    "redis_unknown_option": "redis://localhost:6379/0?db=1",
    "redis_bad_prefix": "redis://localhost:6379/0?prefix=a{b}",
}


@pytest.mark.parametrize("url", _REFUSED.values(), ids=_REFUSED.keys())
def test_a_malformed_url_is_refused_naming_the_accepted_forms(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BrokerError) as caught:
        open_broker(url)
    assert caught.value.code == "invalid_url"
    assert ACCEPTED_BROKER_URLS in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_a_path_naming_a_directory_or_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    for url in (f"sqlite:///{tmp_path}/dir", f"sqlite:///{tmp_path}/file/b.db"):
        with pytest.raises(BrokerError, match="directory") as caught:
            open_broker(url)
        assert caught.value.code == "invalid_url"


def test_a_refused_broker_url_never_shows_its_password() -> None:
    from gateway.broker import BrokerError as Refused
    from gateway.broker import open_broker as open_it

    for url in ("redis://:hunter2@localhost:99999/0", "rediss://u:hunter2@h/0?prefix=a{b}"):
        with pytest.raises(Refused) as caught:
            open_it(url)
        assert "hunter2" not in str(caught.value)
        assert ":***@" in str(caught.value)

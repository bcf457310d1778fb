"""The settings model: bounds, the checks between fields, routing, effective URLs, warnings."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError

from adapters.web.settings import DEFAULT_WEB_URL, web_mailbox_url
from config import (
    DEFAULT_BROKER_URL,
    DEFAULT_STORE_URL,
    Route,
    Settings,
    SettingsError,
    format_settings_error,
    load_settings,
)
from config.settings import default_session, is_session_id
from gateway.channels import channel_state, gateway_settings
from harness_core import SessionError
from harness_core.clock import SystemClock
from harness_core.session.names import check_session_id


def _refusal(**values: object) -> str:
    with pytest.raises(ValidationError) as caught:
        Settings.model_validate(values)
    line = format_settings_error(caught.value)
    assert "\n" not in line
    return line


def test_the_defaults_are_consistent_and_embedded() -> None:
    settings = Settings()
    assert settings.effective_store_url == DEFAULT_STORE_URL
    assert settings.effective_broker_url == DEFAULT_BROKER_URL
    assert web_mailbox_url(settings) == DEFAULT_WEB_URL
    assert settings.shutdown_seconds == 15
    assert settings.warnings() == ()


# --- the checks between settings ---------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "names", "rule"),
    [
        ({"renew_seconds": 10}, ("renew_seconds=10", "lease_seconds=30"), "3 x renew_seconds"),
        ({"lease_seconds": 15}, ("renew_seconds=5", "lease_seconds=15"), "one failed renewal"),
        ({"drain_seconds": 15}, ("drain_seconds=15", "shutdown_seconds=15"), "drain_seconds"),
        ({"shutdown_seconds": 5}, ("drain_seconds=10", "shutdown_seconds=5"), "shutdown"),
        (
            {"linger_seconds": 10.5},
            ("linger_seconds=10.5", "lease_seconds=30"),
            "3 x linger_seconds must be at most lease_seconds",
        ),
        (
            {"lease_seconds": 3, "renew_seconds": 0.5, "linger_seconds": 1.5},
            ("linger_seconds=1.5", "lease_seconds=3"),
            "outlasts its linger",
        ),
        (
            {"delivery_timeout_seconds": 30},
            ("delivery_timeout_seconds=30", "outbox_lease_seconds=60"),
            "2 x delivery_timeout_seconds",
        ),
    ],
)
def test_settings_that_do_not_work_together_are_refused(
    values: dict[str, object], names: tuple[str, ...], rule: str
) -> None:
    line = _refusal(**values)
    assert all(name in line for name in names), line
    assert rule in line


def test_every_failed_check_is_reported() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(renew_seconds=20, drain_seconds=20)
    line = format_settings_error(caught.value)
    assert "renew_seconds=20 (given) and lease_seconds=30 (default)" in line
    assert line.endswith("(and 1 more problem)")


def test_settings_just_inside_the_checks_are_accepted() -> None:
    Settings(lease_seconds=3, renew_seconds=0.99, drain_seconds=14.9, delivery_timeout_seconds=29)
    Settings(lease_seconds=3, renew_seconds=0.99, linger_seconds=1)
    assert Settings(linger_seconds=0).linger_seconds == 0  # let go at once


def test_the_default_linger_is_no_reason_to_refuse_a_short_lease() -> None:
    # the default (5 s) is cut to a third of the lease where it runs (the worker's linger)
    assert Settings(lease_seconds=3, renew_seconds=0.5).linger_seconds == 5
    with pytest.raises(ValidationError, match="3 x linger_seconds must be at most"):
        Settings(lease_seconds=3, renew_seconds=0.5, linger_seconds=5)


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("lease_seconds", float("nan"), "a number of seconds from 3 to 300"),
        ("lease_seconds", float("inf"), "a number of seconds from 3 to 300"),
        ("renew_seconds", 0, "above 0 and at most 100"),
        ("renew_seconds", -1, "above 0"),
        ("worker_slots", 10**30, "an integer from 1 to 128"),
        ("worker_slots", True, "an integer from 1 to 128, not true or false"),
        ("port", 0, "an integer from 1 to 65535"),
        ("gc_young_threshold", -1, "an integer from 0 to 10000000"),
        ("linger_seconds", -0.5, "a number of seconds from 0 to 100"),
        ("linger_seconds", 1e9, "a number of seconds from 0 to 100"),
        ("linger_seconds", float("nan"), "a number of seconds from 0 to 100"),
        ("linger_seconds", True, "a number of seconds from 0 to 100, not true or false"),
        ("linger_seconds", "soon", "a number of seconds from 0 to 100"),
        ("gc_young_threshold", 700.5, "an integer from 0 to 10000000"),
        ("port", 8787.5, "an integer from 1 to 65535"),
        ("inbox_dedupe_seconds", 1e300, "from 60 to 2592000"),
        ("outbox_max_delay_seconds", 0.5, "from 1 to 86400"),
        ("model_max_output_tokens", 0, "above 0 and at most 1000000"),
        ("busy_policy", "Steer", "one of steer, follow_up, next_run"),
        ("log_level", "trace", "one of debug, info, warning, error"),
        ("store_url", "postgres://db/x", "a store URL"),
        ("store_url", "", "a store URL"),
        ("store_url", ".gateway/gateway.db", "a store URL"),
        ("broker_url", "jsonl:///x", "a broker URL"),
        ("redis_url", "sqlite:///x.db", "a Redis URL"),
        ("model_base_url", "localhost:11434", "an http:// or https:// URL"),
        ("model_base_url", "http://", "an http:// or https:// URL"),
        ("model_base_url", "http://localhost:114340/v1", "a port from 1 to 65535"),
        ("model_base_url", "http://localhost:11434/v1\r\n", "without spaces or control"),
        ("public_url", "https://gw.example.com/?x=1", "with no ?query or #fragment"),
        ("host", "http://0.0.0.0", "an IP address or a host name"),
        ("host", "", "an IP address or a host name"),
        ("host", "127.0.0.1:8787", "an IP address or a host name"),
        ("model", "", "provider:model_id"),
        ("routes", "slack", "a list of routes"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_setting_the_value_and_what_is_accepted(
    field: str, value: object, accepted: str
) -> None:
    line = _refusal(**{field: value})
    assert line.startswith(f"{field}="), line
    assert accepted in line


def test_a_channel_section_value_is_refused_by_its_setting_name() -> None:
    with pytest.raises(SettingsError) as caught:
        gateway_settings(web_url="jsonl:///x")
    line = str(caught.value)
    assert line.startswith("web_url='jsonl:///x' (given): expected sqlite:///file.db, redis://")


def test_a_secret_is_never_echoed() -> None:
    line = _refusal(model_api_key="   ")
    assert line == "model_api_key=<hidden> (given): expected the provider's key (not empty)"
    settings = Settings(model_api_key=SecretStr("sk-SECRET"), port=8788)
    assert "sk-SECRET" not in repr(settings)
    assert "sk-SECRET" not in str(settings.model_dump())


def test_an_unknown_field_is_refused() -> None:
    line = _refusal(lease_secs=3)
    assert line.startswith("unknown setting lease_secs (given); did you mean lease_seconds?")


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        Settings().port = 1  # type: ignore[misc]


TOKENS = ("alice:operator:a-secret-of-twenty-four-chars",)


def test_hosts_that_are_accepted() -> None:
    for host in ("127.0.0.1", "::1", "localhost"):
        assert Settings(host=host).host == host
    for host in ("::", "0.0.0.0", "gw.internal", "10.0.0.7"):  # beyond loopback: tokens needed
        assert Settings(host=host, ops_tokens=TOKENS).host == host
        with pytest.raises(ValidationError, match="set ops_tokens"):
            Settings(host=host)


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ("alice:operator", "expected name:role:secret"),
        ("Alice:operator:a-secret-of-twenty-four-chars", "the name must be"),
        ("alice:admin:a-secret-of-twenty-four-chars", "the role must be operator or viewer"),
        ("alice:viewer:short", "24+ printable characters"),
        ("a:viewer:a-secret-of-twenty-four-chars,a:operator:another-secret-of-24-chars",
         "unique"),
    ],
)  # fmt: skip
def test_ops_tokens_are_checked_without_showing_the_secret(tokens: str, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)) as caught:
        Settings(ops_tokens=tokens)
    shown = format_settings_error(caught.value)  # what a person sees
    assert message in shown and "twenty-four" not in shown and "short" not in shown


def test_ops_tokens_from_text() -> None:
    settings = Settings(
        ops_tokens="a:viewer:a-secret-of-twenty-four-chars , b:operator:" + "x" * 30
    )
    assert [t.get_secret_value().split(":")[0] for t in settings.ops_tokens] == ["a", "b"]
    assert "a-secret" not in repr(settings)


def test_allowed_hosts_from_text_and_lists() -> None:
    assert Settings(allowed_hosts=" GW.example.com, 10.0.0.7 ,").allowed_hosts == (
        "gw.example.com",
        "10.0.0.7",
    )
    assert Settings(allowed_hosts=["a.example"]).allowed_hosts == ("a.example",)
    assert load_settings({"GATEWAY_ALLOWED_HOSTS": "a.example,b.example"}).allowed_hosts == (
        "a.example",
        "b.example",
    )


@pytest.mark.parametrize(
    "hosts",
    [
        "https://gw.example.com",
        "gw.example.com:8443",
        "*.example.com",
        "gw example.com",
        "gw.example.com/path",
        "-gw.example.com",
        "[::1]",
    ],
)
def test_an_allowed_host_that_is_no_host_name_is_refused(hosts: str) -> None:
    assert "is not a host name" in _refusal(allowed_hosts=hosts)


# --- effective URLs ------------------------------------------------------------------------


def test_redis_url_puts_store_broker_and_web_channel_on_redis() -> None:
    settings = Settings(redis_url="redis://cache:6379/0")
    assert settings.effective_store_url == "redis://cache:6379/0"
    assert settings.effective_broker_url == "redis://cache:6379/0"
    assert web_mailbox_url(settings) == "redis://cache:6379/0"
    assert settings.warnings() == ()


@pytest.mark.parametrize("url", ["redis+cluster://cache:7000", "rediss+cluster://cache:7000/0"])
def test_a_cluster_redis_url_puts_store_broker_and_web_channel_on_the_cluster(url: str) -> None:
    settings = Settings(redis_url=url)
    assert settings.effective_store_url == url
    assert settings.effective_broker_url == url
    assert web_mailbox_url(settings) == url
    assert settings.warnings() == ()
    explicit = gateway_settings(store_url=url, broker_url=url, web_url=url)
    assert (explicit.store_url, explicit.broker_url, web_mailbox_url(explicit)) == (url, url, url)
    (warning,) = Settings(redis_url=url, store_url="sqlite:///gw.db").warnings()
    assert "the broker is Redis but the store (sqlite) is a local file" in warning


def test_explicit_urls_win_over_redis_url() -> None:
    settings = gateway_settings(
        redis_url="redis://cache:6379/0",
        store_url="redis://store:6379/1",
        broker_url="sqlite:///b.db",
        web_url="memory://",
    )
    assert settings.effective_store_url == "redis://store:6379/1"
    assert settings.effective_broker_url == "sqlite:///b.db"
    assert web_mailbox_url(settings) == "memory://"


def test_an_explicit_store_url_wins_even_when_it_equals_the_default() -> None:
    settings = Settings(redis_url="redis://cache:6379/0", store_url=DEFAULT_STORE_URL)
    assert settings.effective_store_url == DEFAULT_STORE_URL
    assert settings.effective_broker_url == "redis://cache:6379/0"


def test_replace_checks_the_change_and_keeps_what_was_set_explicitly() -> None:
    settings = Settings(redis_url="redis://cache:6379/0", model_api_key=SecretStr("sk-x"))
    changed = settings.replace(log_level="debug")
    assert changed.log_level == "debug"
    assert changed.effective_store_url == "redis://cache:6379/0"
    assert changed.model_api_key == SecretStr("sk-x")
    assert settings.replace(store_url="memory://").effective_store_url == "memory://"
    with pytest.raises(ValidationError):
        settings.replace(renew_seconds=20)


# --- warnings ------------------------------------------------------------------------------


def test_a_public_address_is_a_warning_not_an_error() -> None:
    (warning,) = Settings(host="0.0.0.0", ops_tokens=TOKENS).warnings()
    assert warning.startswith("host=0.0.0.0 is not a loopback address")
    assert Settings(host="localhost").warnings() == ()
    assert Settings(host="::1").warnings() == ()


def test_a_redis_broker_with_local_files_warns_they_bind_processes_to_one_machine() -> None:
    settings = gateway_settings(
        redis_url="redis://cache:6379/0", store_url="sqlite:///gw.db", web_url="sqlite:///w.db"
    )
    (warning,) = settings.warnings(channel_state(settings, SystemClock()))
    assert "the store (sqlite) and the web channel (sqlite) are local files" in warning


def test_a_memory_store_warns_that_sessions_do_not_survive() -> None:
    (warning,) = Settings(store_url="memory://").warnings()
    assert warning.startswith("the store is memory://")


# --- routes --------------------------------------------------------------------------------


def _routes(*triples: tuple[str, str, str]) -> tuple[Route, ...]:
    return tuple(Route(channel=c, space=s, session=n) for c, s, n in triples)


def test_first_matching_route_wins_and_star_matches_any_space() -> None:
    settings = Settings(
        routes=_routes(
            ("slack", "C123", "ops"),
            ("email", "ops@example.com", "ops"),
            ("slack", "*", "chatter"),
        )
    )
    assert settings.route_for("slack", "C123") == "ops"
    assert settings.route_for("email", "ops@example.com") == "ops"
    assert settings.route_for("slack", "C999") == "chatter"
    assert settings.route_for("email", "other@example.com") == "email-other@example.com"
    assert settings.route_for("web", "C123") == "web-C123"


def test_a_route_space_defaults_to_every_space() -> None:
    assert Route(channel="web", session="web").space == "*"


def test_two_routes_for_one_channel_and_space_are_refused() -> None:
    line = _refusal(
        routes=[
            {"channel": "slack", "space": "C1", "session": "a"},
            {"channel": "email", "space": "C1", "session": "b"},
            {"channel": "slack", "space": "C1", "session": "c"},
        ]
    )
    assert "routes[0] and routes[2] both bind slack space C1" in line


def test_a_route_after_a_star_route_of_its_channel_is_refused() -> None:
    line = _refusal(
        routes=[
            {"channel": "slack", "session": "all"},
            {"channel": "slack", "space": "C1", "session": "ops"},
        ]
    )
    assert "routes[1] (slack space C1) comes after routes[0] (slack space *)" in line


@pytest.mark.parametrize(
    ("route", "path", "accepted"),
    [
        (
            {"channel": "slack", "space": "C1", "session": "bad id"},
            "routes[0].session",
            "a session id",
        ),
        (
            {"channel": "slack", "space": "C1", "session": "-ops"},
            "routes[0].session",
            "a session id",
        ),
        ({"channel": "slack", "space": "C1", "session": "x" * 201}, "routes[0].session", "1-200"),
        ({"channel": "Slack", "space": "C1", "session": "ops"}, "routes[0].channel", "a channel"),
        ({"channel": "slack:x", "space": "C1", "session": "ops"}, "routes[0].channel", "a channel"),
        ({"channel": "slack", "space": "", "session": "ops"}, "routes[0].space", "a space"),
        ({"channel": "slack", "space": "a b", "session": "ops"}, "routes[0].space", "a space"),
        ({"channel": "slack", "space": "C1", "session": 5}, "routes[0].session", "text"),
    ],
)
def test_a_bad_route_names_its_field(route: dict[str, object], path: str, accepted: str) -> None:
    line = _refusal(routes=[route])
    assert line.startswith(f"{path}="), line
    assert accepted in line


def test_a_route_with_an_unknown_or_missing_key_is_refused() -> None:
    assert _refusal(routes=[{"channel": "slack", "sesion": "ops"}]).startswith(
        "routes[0].session is missing"
    )
    with pytest.raises(ValidationError) as caught:
        Settings(routes=[{"channel": "slack", "session": "ops", "sesion": "x"}])
    assert format_settings_error(caught.value).startswith("unknown key routes[0].sesion (given)")


@pytest.mark.parametrize(
    ("channel", "space", "session"),
    [
        ("slack", "C123", "slack-C123"),
        ("email", "ops@example.com", "email-ops@example.com"),
        ("web", "team.a", "web-team.a"),
    ],
)
def test_an_unrouted_space_gets_its_own_session(channel: str, space: str, session: str) -> None:
    assert Settings().route_for(channel, space) == session


def test_sanitized_sessions_of_different_spaces_stay_apart() -> None:
    first, second = default_session("web", "a b"), default_session("web", "a-b")
    assert first != second
    assert first.startswith("web-a-b-")
    long = default_session("web", "x" * 500)
    assert len(long) == 200
    assert long != default_session("web", "x" * 499)


@given(st.text(max_size=300), st.text(max_size=300))
def test_every_default_session_is_a_valid_session_id(channel: str, space: str) -> None:
    session = default_session(channel, space)
    check_session_id(session)
    assert default_session(channel, space) == session


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=210))
def test_the_session_id_rule_is_the_stores(text: str) -> None:
    try:
        check_session_id(text)
        store_accepts = True
    except SessionError:
        store_accepts = False
    assert is_session_id(text) == store_accepts


@pytest.mark.parametrize(
    "text", ["a", "A.b_c:d@e+f=g-h", "9" * 200, "9" * 201, "-a", "", "a b", "0\n", "a\n"]
)
def test_the_session_id_rule_at_its_edges(text: str) -> None:
    try:
        check_session_id(text)
        store_accepts = True
    except SessionError:
        store_accepts = False
    assert is_session_id(text) == store_accepts

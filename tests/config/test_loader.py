"""Loading: the environment over .env over a TOML file over defaults; one line per bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import (
    Route,
    Settings,
    SettingsError,
    UnknownSetting,
    format_settings_error,
    load_settings,
)
from gateway.channels import load_gateway_settings


def _refusal(environ: dict[str, str] | None = None, **files: Path) -> SettingsError:
    with pytest.raises(SettingsError) as caught:
        load_gateway_settings({} if environ is None else environ, **files)
    error = caught.value
    assert "\n" not in str(error)
    assert all("\n" not in problem for problem in error.problems)
    # no pydantic error (which repeats every input, secrets included) chained behind it
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__
    assert format_settings_error(error) == str(error)
    return error


def _toml(tmp_path: Path, text: str, name: str = "gateway.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- the environment (the existing rules) ------------------------------------------------


def test_the_embedded_default_store() -> None:
    assert load_settings({}).store_url == "sqlite:///.gateway/gateway.db"


def test_the_store_comes_from_the_environment() -> None:
    settings = load_settings({"GATEWAY_STORE_URL": "redis://cache:6379/2", "PATH": "/bin"})
    assert settings == Settings(store_url="redis://cache:6379/2")


def test_a_misspelt_variable_is_an_error_naming_it() -> None:
    with pytest.raises(UnknownSetting) as caught:
        load_settings({"GATEWAY_STORE_ULR": "sqlite:///x.db"})
    assert "GATEWAY_STORE_ULR" in str(caught.value)
    assert "GATEWAY_STORE_URL" in str(caught.value)


@pytest.mark.parametrize(
    ("name", "url"),
    [
        ("GATEWAY_STORE_URL", "postgres://user:hunter2@db/x"),
        ("GATEWAY_REDIS_URL", "redis+x://:hunter2@cache/0"),
        ("GATEWAY_BROKER_URL", "mysql://u:hunter2@h/b"),
    ],
)
def test_a_refused_url_never_shows_its_password(name: str, url: str) -> None:
    error = _refusal({name: url})
    assert "hunter2" not in str(error)
    assert ":***@" in str(error)


def test_the_process_environment_is_read(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GATEWAY_STORE_URL", "memory://")
    assert load_settings().store_url == "memory://"


def test_an_unknown_variable_far_from_any_setting_says_where_they_are_listed() -> None:
    error = _refusal({"GATEWAY_XYZZY": "1"})
    assert isinstance(error, UnknownSetting)
    # it listed all 87 names on one line of 2,500 characters
    assert str(error) == (
        "unknown setting GATEWAY_XYZZY in the environment; .env.example and the README's "
        "Configure it section list every setting"
    )


def test_the_ops_clients_variables_are_not_settings_and_not_refused() -> None:
    """`gateway ops` reads GATEWAY_OPS_URL and GATEWAY_OPS_TOKEN; the service ignores them."""
    env = {"GATEWAY_OPS_URL": "http://127.0.0.1:1", "GATEWAY_OPS_TOKEN": "x", "GATEWAY_PORT": "9"}
    assert load_settings(env).port == 9


def test_variable_names_are_case_insensitive_but_one_setting_is_set_once() -> None:
    assert load_settings({"gateway_port": "9000"}).port == 9000
    error = _refusal({"GATEWAY_PORT": "9000", "gateway_port": "9001"})
    assert "GATEWAY_PORT in the environment and gateway_port in the environment both set port" in (
        str(error)
    )


def test_all_kinds_of_values_from_the_environment() -> None:
    settings = load_settings(
        {
            "GATEWAY_MODEL_API_KEY": "sk-test",
            "GATEWAY_WORKER_SLOTS": "8",
            "GATEWAY_LEASE_SECONDS": "45.5",
            "GATEWAY_BUSY_POLICY": "next_run",
            "GATEWAY_ROUTES": '[{"channel":"slack","space":"C123","session":"ops"}]',
        }
    )
    assert settings.model_api_key is not None
    assert settings.model_api_key.get_secret_value() == "sk-test"
    assert (settings.worker_slots, settings.lease_seconds) == (8, 45.5)
    assert settings.busy_policy == "next_run"
    assert settings.routes == (Route(channel="slack", space="C123", session="ops"),)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("GATEWAY_PORT", "", "GATEWAY_PORT in the environment is set but empty: give an integer"),
        ("GATEWAY_PORT", "   ", "is set but empty"),
        ("GATEWAY_MODEL_API_KEY", "", "is set but empty: give the provider's key (not empty), "),
        ("GATEWAY_ROUTES", "", "is set but empty"),
        (  # its default is no token list but a local token: said so ("none" before)
            "GATEWAY_OPS_TOKENS",
            "",
            "is set but empty: give name:role:secret tokens, comma-separated, or unset it "
            "(default: none: on loopback, a local token made at first start)",
        ),
        ("GATEWAY_OPS_TOKENS", ",", "names no token (only commas)"),  # was taken for unset
        (
            "GATEWAY_PORT",
            "abc",
            "port='abc' (GATEWAY_PORT in the environment): expected an integer",
        ),
        ("GATEWAY_PORT", "8787.5", "expected an integer from 1 to 65535"),
        ("GATEWAY_PORT", "-1", "port='-1' (GATEWAY_PORT in the environment)"),
        ("GATEWAY_PORT", "9" * 400, "expected an integer from 1 to 65535"),
        ("GATEWAY_LEASE_SECONDS", "nan", "lease_seconds='nan' (GATEWAY_LEASE_SECONDS in the "),
        ("GATEWAY_LEASE_SECONDS", "NaN", "expected a number of seconds from 3 to 300"),
        ("GATEWAY_LEASE_SECONDS", "inf", "expected a number of seconds from 3 to 300"),
        ("GATEWAY_LEASE_SECONDS", "1e400", "expected a number of seconds from 3 to 300"),
        ("GATEWAY_LEASE_SECONDS", "-30", "expected a number of seconds from 3 to 300"),
        ("GATEWAY_LEASE_SECONDS", "true", "expected a number of seconds from 3 to 300"),
        ("GATEWAY_RENEW_SECONDS", "0", "expected a number of seconds above 0 and at most 100"),
        ("GATEWAY_BUSY_POLICY", "later", "expected one of steer, follow_up, next_run"),
        ("GATEWAY_STORE_URL", "postgres://x/y", "expected a store URL"),
        ("GATEWAY_ROUTES", "[{", "GATEWAY_ROUTES in the environment is not JSON ("),
        ("GATEWAY_ROUTES", "slack:C1=ops", "expected a JSON list of routes, like [{"),
        ("GATEWAY_ROUTES", '{"channel":"slack","session":"ops"}', "expected a list of routes"),
        ("GATEWAY_ROUTES", "[1]", "routes[0]=1 (GATEWAY_ROUTES in the environment)"),
        # a traceback of 3,000 lines, and a key given twice silently last-wins (outside probe)
        ("GATEWAY_ROUTES", "[" * 5000 + "]" * 5000, "in the environment is nested too deep"),
        (
            "GATEWAY_PROFILES",
            '[{"name":"default","deny_tools":["danger"],"deny_tools":[]}]',
            "GATEWAY_PROFILES in the environment gives 'deny_tools' twice in one object: keep one",
        ),
        (
            "GATEWAY_ROUTES",
            '[{"channel":"slack","session":"ops"},{"channel":"slack","session":"x"}]',
            "routes (GATEWAY_ROUTES in the environment): routes[0] and routes[1] both bind",
        ),
        (
            "GATEWAY_ROUTES",
            '[{"channel":"slack","space":"C1","session":"no spaces"}]',
            "routes[0].session='no spaces' (GATEWAY_ROUTES in the environment): expected a "
            "session id",
        ),
    ],
)
def test_a_hostile_variable_is_one_line(variable: str, value: str, expected: str) -> None:
    error = _refusal({variable: value})
    assert expected in str(error)


def test_a_long_bad_value_is_cut_short() -> None:
    error = _refusal({"GATEWAY_BUSY_POLICY": "x" * 10_000})
    assert len(str(error)) < 250


def test_checks_between_settings_name_where_each_came_from(tmp_path: Path) -> None:
    config = _toml(tmp_path, "# timings\nlease_seconds = 12\n")
    error = _refusal({"GATEWAY_RENEW_SECONDS": "4"}, config_file=config)
    assert str(error) == (
        f"renew_seconds=4 (GATEWAY_RENEW_SECONDS in the environment) and lease_seconds=12 "
        f"(lease_seconds in {config} line 2): 3 x renew_seconds must be less than "
        "lease_seconds, so a lease survives one failed renewal"
    )


def test_a_caller_s_check_is_said_naming_the_setting_and_where_it_came_from(
    tmp_path: Path,
) -> None:
    def no_x(value: object) -> None:
        if "x" in str(value):
            raise ValueError(f"{value!r} holds an x")

    config = _toml(tmp_path, 'instructions = "fine"\nstore_url = "sqlite:///x.db"\n')
    with pytest.raises(SettingsError) as raised:
        load_settings({}, config_file=config, checks={"store_url": no_x, "instructions": no_x})
    assert (
        str(raised.value)
        == f"store_url (store_url in {config} line 2): 'sqlite:///x.db' holds an x"
    )
    # a setting not set is not checked (its default is the caller's own)
    assert load_settings({}, checks={"store_url": no_x}).store_url.endswith("gateway.db")


def test_an_empty_secret_is_said_to_be_unset() -> None:
    # "ops_tokens=<hidden> (default)" read as if a token were set and wrong
    error = _refusal({"GATEWAY_HOST": "0.0.0.0"})
    assert str(error).startswith(
        "host=0.0.0.0 (GATEWAY_HOST in the environment) and ops_tokens=unset (default): "
    )


def test_every_problem_is_kept_and_the_line_says_how_many_more() -> None:
    error = _refusal({"GATEWAY_PORT": "x", "GATEWAY_WORKER_SLOTS": "0", "GATEWAY_HOST": "a b"})
    assert len(error.problems) == 3
    assert str(error).endswith("(and 2 more problems)")


# --- the TOML file -------------------------------------------------------------------------


def test_a_toml_file_sets_plain_values_and_routes(tmp_path: Path) -> None:
    config = _toml(
        tmp_path,
        """
        store_url = "sqlite:///state/gw.db"
        worker_slots = 8
        lease_seconds = 60   # an integer where a number is expected
        busy_policy = "follow_up"

        [[routes]]
        channel = "slack"
        space = "C123"
        session = "ops"

        [[routes]]
        channel = "email"
        session = "mail"
        """,
    )
    settings = load_settings({}, config_file=config)
    assert settings.store_url == "sqlite:///state/gw.db"
    assert (settings.worker_slots, settings.lease_seconds) == (8, 60.0)
    assert settings.busy_policy == "follow_up"
    assert settings.routes == (
        Route(channel="slack", space="C123", session="ops"),
        Route(channel="email", space="*", session="mail"),
    )
    assert settings.route_for("email", "anyone@example.com") == "mail"


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_setting_takes_true_or_false_from_the_file_and_the_environment(
    tmp_path: Path, value: bool
) -> None:
    word = str(value).lower()
    config = _toml(tmp_path, f"provider_spans = {word}\n")
    assert load_settings({}, config_file=config).provider_spans is value
    assert load_settings({"GATEWAY_PROVIDER_SPANS": word}).provider_spans is value


def test_the_environment_wins_over_the_file_and_replaces_its_routes(tmp_path: Path) -> None:
    config = _toml(
        tmp_path,
        'worker_slots = 8\nport = 9000\n[[routes]]\nchannel = "slack"\nsession = "ops"\n',
    )
    settings = load_settings(
        {
            "GATEWAY_WORKER_SLOTS": "2",
            "GATEWAY_ROUTES": '[{"channel":"web","session":"web"}]',
        },
        config_file=config,
    )
    assert (settings.worker_slots, settings.port) == (2, 9000)
    assert settings.routes == (Route(channel="web", session="web"),)


def test_a_setting_from_the_file_counts_as_set_explicitly(tmp_path: Path) -> None:
    config = _toml(tmp_path, 'store_url = "sqlite:///.gateway/gateway.db"\n')
    settings = load_settings({"GATEWAY_REDIS_URL": "redis://cache:6379/0"}, config_file=config)
    assert settings.effective_store_url == "sqlite:///.gateway/gateway.db"
    assert settings.effective_broker_url == "redis://cache:6379/0"


def test_a_setting_given_flat_and_in_its_table_is_refused(tmp_path: Path) -> None:
    """`slack_bot_token` beside `[slack] bot_token`: the table's value was used without a word
    (an operator who rotated one of them never learnt which was in force); `.env` refuses the
    same conflict (an outside probe)."""
    config = _toml(
        tmp_path,
        'slack_bot_token = "xoxb-1"\nslack_signing_secret = "abcdefabcdefabcdef123456"\n'
        '[slack]\nbot_token = "xoxb-2"\n',
    )
    error = _refusal(config_file=config)
    assert f"slack_bot_token in {config} line 1 and slack.bot_token in {config} line 4" in str(
        error
    )
    assert "both set slack_bot_token: keep one" in str(error)
    assert "xoxb" not in str(error)  # where, never what


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lease_secs = 30\n", "unknown setting 'lease_secs' in {path} line 1; did you mean "),
        ("port = 1\n\n[worker]\nslots = 4\n", "unknown setting 'worker' in {path} line 3; "),
        ('"GATEWAY_PORT" = 1\n', "unknown setting 'GATEWAY_PORT' in {path} line 1; did you "),
    ],
)
def test_an_unknown_key_names_the_key_the_file_and_the_line(
    tmp_path: Path, text: str, expected: str
) -> None:
    config = _toml(tmp_path, text)
    error = _refusal(config_file=config)
    assert isinstance(error, UnknownSetting)
    assert str(error).startswith(expected.format(path=config))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('port = "x"\n', "port='x' (port in {path} line 1): expected an integer from 1 to 65535"),
        ("worker_slots = true\n", "worker_slots=true (worker_slots in {path} line 1): expected "),
        ("lease_seconds = nan\n", "lease_seconds=nan (lease_seconds in {path} line 1): expected"),
        ("lease_seconds = inf\n", "expected a number of seconds from 3 to 300"),
        ("lease_seconds = -inf\n", "expected a number of seconds from 3 to 300"),
        ("max_attempts = 1e9\n", "expected an integer from 1 to 20"),
        ("max_attempts = 0x7fffffffffffffff\n", "expected an integer from 1 to 20"),
        ("model = 5\n", "model=5 (model in {path} line 1): expected provider:model_id"),
        (
            "log_level = 1979-05-27\n",
            "log_level=1979-05-27 (log_level in {path} line 1): expected one",
        ),
        ("busy_policy = []\n", "expected one of steer, follow_up, next_run"),
        ('store_url = ""\n', "store_url='' (store_url in {path} line 1): expected a store URL"),
        ('routes = "slack"\n', "routes='slack' (routes in {path} line 1): expected a list"),
        (
            '[routes]\nchannel = "slack"\nsession = "ops"\n',
            "(routes in {path} line 1): expected a list of routes",
        ),
        (
            '[[routes]]\nchannel = "slack"\nsession = "a"\n\n[[routes]]\nchannel = "web"\n'
            'sesion = "b"\n',
            "routes[1].session is missing (routes in {path} line 5): a route has channel, "
            "session and",
        ),
        (
            '[[routes]]\nchannel = "web"\nsession = "b"\nsesion = "b"\n',
            "unknown key routes[0].sesion (routes in {path} line 1)",
        ),
        (
            'routes = [{channel = "slack", session = "a b"}]\n',
            "routes[0].session='a b' (routes in {path} line 1): expected a session id",
        ),
    ],
)
def test_a_wrong_value_in_the_file_names_it_and_its_line(
    tmp_path: Path, text: str, expected: str
) -> None:
    config = _toml(tmp_path, text)
    error = _refusal(config_file=config)
    assert expected.format(path=config) in str(error)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("port = 1\nworker_slots = \n", "is not valid TOML: Invalid value (at line 2, column 16)"),
        ("port = 1\nport = 2\n", "is not valid TOML: Cannot overwrite a value (at line 2"),
        ("[[routes]\n", "is not valid TOML: "),
        ("GATEWAY_PORT=1\nexport X=2\n", "is not valid TOML: "),
        ("x = " + "[" * 1000 + "]" * 1000 + "\n", "is not valid TOML: nested too deep"),
    ],
)
def test_a_malformed_file_is_one_line_with_its_line_number(
    tmp_path: Path, text: str, expected: str
) -> None:
    config = _toml(tmp_path, text)
    error = _refusal(config_file=config)
    assert str(error).startswith(f"config file {config} ")
    assert expected in str(error)


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert str(_refusal(config_file=missing)) == (
        f"cannot read config file {missing}: No such file or directory"
    )
    assert str(_refusal(config_file=tmp_path)).endswith("Is a directory")
    (tmp_path / "gateway.example.toml").write_text("")  # a newcomer's first --config
    assert str(_refusal(config_file=tmp_path / "gateway.toml")).endswith(
        "No such file or directory (copy gateway.example.toml beside it to begin)"
    )
    # a relative one says where it was looked for (scripts/run runs from the repository)
    assert str(_refusal(config_file=Path("no-such-gateway.toml"))).startswith(
        f"cannot read config file no-such-gateway.toml (read from {Path.cwd()}): "
        "No such file or directory"
    )
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"port = 1\n\xff\xfe")
    assert str(_refusal(config_file=binary)) == (
        f"config file {binary} is not UTF-8 text (byte 9 cannot be decoded)"
    )


def test_an_empty_file_changes_nothing(tmp_path: Path) -> None:
    assert load_settings({}, config_file=_toml(tmp_path, "")) == Settings()


def test_a_secret_in_the_file_is_never_echoed(tmp_path: Path) -> None:
    config = _toml(tmp_path, "model_api_key = 123456789\n")
    error = _refusal(config_file=config)
    assert "123456789" not in str(error)
    assert str(error).startswith("model_api_key=<hidden> (model_api_key in ")


# --- .env --------------------------------------------------------------------------------


def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for key in list(os.environ):
        if key.upper().startswith("GATEWAY_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def test_dotenv_in_the_current_directory_is_read_with_the_process_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _clean_environment(monkeypatch, tmp_path)
    (tmp_path / ".env").write_text(
        "# settings\nexport GATEWAY_PORT=9000\nGATEWAY_MODEL='openai:gpt-4.1-mini'\n"
        'GATEWAY_ROUTES=\'[{"channel":"web","session":"web"}]\'\nOTHER_TOOL=x\n'
        'GATEWAY_HOST="localhost"  # a comment\n'
    )
    monkeypatch.setenv("GATEWAY_PORT", "9001")
    settings = load_settings()
    assert settings.port == 9001  # the environment wins over .env
    assert settings.model == "openai:gpt-4.1-mini"
    assert settings.host == "localhost"
    assert settings.routes == (Route(channel="web", session="web"),)


def test_dotenv_wins_over_the_file(tmp_path: Path) -> None:
    dotenv = tmp_path / "gw.env"
    dotenv.write_text("GATEWAY_PORT=9000\n")
    config = _toml(tmp_path, "port = 8000\nworker_slots = 9\n")
    settings = load_settings({"GATEWAY_WORKER_SLOTS": "3"}, config_file=config, env_file=dotenv)
    assert (settings.port, settings.worker_slots) == (9000, 3)


def test_a_given_environment_is_all_of_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _clean_environment(monkeypatch, tmp_path)
    (tmp_path / ".env").write_text("GATEWAY_PORT=9000\n")
    assert load_settings({}).port == 8787
    assert load_settings().port == 9000


def test_dotenv_values_are_literal(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("GATEWAY_MODEL_BASE_URL=http://${HOST}/v1\n")
    settings = load_settings({"HOST": "proxy"}, env_file=dotenv)
    assert settings.model_base_url == "http://${HOST}/v1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A=1\n\nGATEWAY_PROT=1\n", "unknown setting GATEWAY_PROT in {path} line 3; did you mean "),
        ("GATEWAY_PORT=\n", "GATEWAY_PORT in {path} line 1 is set but empty"),
        ("GATEWAY_PORT\n", "GATEWAY_PORT in {path} line 1 is set but empty"),
        ("GATEWAY_PORT=1\nGATEWAY_PORT=2\n", "GATEWAY_PORT in {path} line 1 and GATEWAY_PORT in"),
        ("\n\nGATEWAY_PORT=x\n", "port='x' (GATEWAY_PORT in {path} line 3): expected an integer"),
        ("A=1\nGATEWAY_MODEL_API_KEY sk-SECRET\n", "env file {path} line 2 is not KEY=value"),
    ],
)
def test_a_bad_dotenv_names_the_file_and_line(tmp_path: Path, text: str, expected: str) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text(text)
    error = _refusal(env_file=dotenv)
    assert expected.format(path=dotenv) in str(error)
    assert "SECRET" not in str(error)


def test_a_named_dotenv_must_exist(tmp_path: Path) -> None:
    missing = tmp_path / "missing.env"
    assert str(_refusal(env_file=missing)) == (
        f"cannot read env file {missing}: No such file or directory"
    )


def test_format_settings_error_is_the_line_for_a_direct_construction_too() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        Settings(port=0)
    assert format_settings_error(caught.value) == (
        "port=0 (given): expected an integer from 1 to 65535"
    )

"""The [[mcp.servers]] section: read from TOML and JSON, refused in one line, no secret shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.loader import SettingsError
from gateway.channels import gateway_settings, load_gateway_settings
from gateway.mcp.settings import McpSection, mcp_secrets, mcp_section

TOML = """
[[mcp.servers]]
name = "tickets"
command = "python"
args = ["-m", "tickets"]
env = { TICKETS_TOKEN = "tickets-secret-value" }
tools = ["get_*", "close_ticket"]
overrides = { close_ticket = { approval = true, approvers = ["alice"] } }

[[mcp.servers]]
name = "docs"
url = "https://user:url-password-1@mcp.example.com/mcp?x=1"
headers = { "X-Api-Key" = "header-secret-value" }
bearer_token = "bearer-secret-value"
trusted = true
"""


def _load(tmp_path: Path, text: str) -> McpSection:
    config = tmp_path / "gateway.toml"
    config.write_text(text)
    return mcp_section(load_gateway_settings({}, config_file=config))


def _problem(tmp_path: Path, text: str) -> str:
    config = tmp_path / "gateway.toml"
    config.write_text(text)
    with pytest.raises(SettingsError) as caught:
        load_gateway_settings({}, config_file=config)
    return str(caught.value)


def test_servers_are_read_from_toml(tmp_path: Path) -> None:
    section = _load(tmp_path, TOML)
    tickets, docs = section.servers
    assert (tickets.name, tickets.transport, tickets.target) == ("tickets", "stdio", "python")
    assert tickets.args == ("-m", "tickets")
    assert tickets.tools == ("get_*", "close_ticket")
    assert tickets.overrides["close_ticket"].approvers == ("alice",)
    assert tickets.overrides["close_ticket"].replay is None
    assert tickets.trusted is False and docs.trusted is True
    assert (docs.transport, docs.target) == ("http", "https://mcp.example.com/mcp")
    assert docs.max_output_chars == 20_000


def test_the_variable_holds_the_same_as_json() -> None:
    value = [{"name": "a", "command": "srv", "env": {"K": "env-secret-value"}}]
    settings = load_gateway_settings({"GATEWAY_MCP_SERVERS": json.dumps(value)})
    (server,) = mcp_section(settings).servers
    assert server.env["K"].get_secret_value() == "env-secret-value"


def test_no_servers_by_default() -> None:
    assert mcp_section(gateway_settings()).servers == ()


def test_every_secret_is_handed_to_the_redactor(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(TOML)
    secrets = set(mcp_secrets(load_gateway_settings({}, config_file=config)))
    assert {
        "tickets-secret-value",
        "header-secret-value",
        "bearer-secret-value",
        "url-password-1",
    } <= secrets


def test_keys_passed_in_args_or_a_url_query_are_secrets() -> None:
    """A server's stderr that repeated `--api-key X` showed X to every viewer of the health."""
    value = [
        {
            "name": "a",
            "command": "npx",
            "args": ["-y", "srv", "--api-key", "arg-key-1", "--token=arg-token-2", "--port", "80"],
        },
        {"name": "b", "url": "https://h.example/mcp?api_key=query-key-3&region=eu"},
    ]
    settings = load_gateway_settings({"GATEWAY_MCP_SERVERS": json.dumps(value)})
    secrets = set(mcp_secrets(settings))
    assert {"arg-key-1", "arg-token-2", "query-key-3"} <= secrets
    assert not {"-y", "srv", "80", "eu", "--port"} & secrets


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '[[mcp.servers]]\nname = "a"\ncommand = "x"\n[[mcp.servers]]\nname = "a"\nurl = "http://h/"\n',
            "two MCP servers are named 'a'",
        ),
        ('[[mcp.servers]]\nname = "a"\ncommand = "x"\nurl = "http://h/"\n', "both command"),
        ('[[mcp.servers]]\nname = "a"\n', "neither command"),
        ('[[mcp.servers]]\nname = "Bad Name"\ncommand = "x"\n', "is not 1-32 of a-z"),
        ('[[mcp.servers]]\nname = "a"\nurl = "ftp://h/"\n', "http"),
        (
            '[[mcp.servers]]\nname = "a"\ncommand = "x"\ncall_timeout_seconds = -1\n',
            "greater than 0",
        ),
        (
            '[[mcp.servers]]\nname = "a"\ncommand = "x"\nbogus = 1\n',
            "unknown key mcp_servers[0].bogus",
        ),
        (
            '[[mcp.servers]]\nname = "a"\ncommand = "x"\n'
            'overrides = { t = { replay = "maybe" } }\n',
            "mcp_servers[0].overrides.t.replay",
        ),
        ('[[mcp.servers]]\nname = "a"\ncommand = "x"\nheaders = { H = "v" }\n', "apply to a url"),
        # a switch that grants trust or waives approval: true or false, never "yes" or 1
        ('[[mcp.servers]]\nname = "a"\ncommand = "x"\ntrusted = "yes"\n', "give true or false"),
        (
            '[[mcp.servers]]\nname = "a"\ncommand = "x"\noverrides = { t = { approval = 0 } }\n',
            "give true or false",
        ),
    ],
)
def test_bad_config_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    problem = _problem(tmp_path, text)
    assert said in problem
    assert "\n" not in problem and "Traceback" not in problem


def test_a_refused_secret_is_never_shown(tmp_path: Path) -> None:
    problem = _problem(
        tmp_path,
        '[[mcp.servers]]\nname = "a"\nurl = "http://h/"\nheaders = { H = "secret\\nvalue-123" }\n'
        '[[mcp.servers]]\nname = "b"\ncommand = "x"\nenv = { K = 12345678 }\n',
    )
    assert "value-123" not in problem and "12345678" not in problem


@pytest.mark.parametrize(
    "text",
    [  # `[mcp.servers]` for `[[mcp.servers]]`, a common slip: the whole table was shown
        '[mcp.servers]\nname = "u"\ncommand = "x"\nbearer_token = "tok-secret-1"\n',
        '[mcp.servers]\nname = "u"\nurl = "http://h/"\nheaders = { K = "tok-secret-1" }\n',
        '[[mcp.servers]]\nname = "u"\ncommand = "x"\n[[mcp.servers.env]]\nK = "tok-secret-1"\n',
    ],
)
def test_a_value_holding_a_secret_is_never_shown(tmp_path: Path, text: str) -> None:
    problem = _problem(tmp_path, text)
    assert "mcp_servers" in problem and "<hidden>" in problem
    assert "tok-secret" not in problem


def test_a_variable_holding_a_secret_is_never_shown() -> None:
    value = {"name": "u", "command": "x", "env": {"API_KEY": "tok-secret-2"}}  # not a list
    with pytest.raises(SettingsError) as caught:
        load_gateway_settings({"GATEWAY_MCP_SERVERS": json.dumps(value)})
    assert str(caught.value).startswith(
        "mcp_servers=<hidden> (GATEWAY_MCP_SERVERS in the environment): expected a list"
    )


def test_the_service_redactor_hides_them(tmp_path: Path) -> None:
    from gateway.redact import Redactor

    config = tmp_path / "gateway.toml"
    config.write_text(TOML)
    redactor = Redactor.from_settings(load_gateway_settings({}, config_file=config), environ={})
    line = "env tickets-secret-value header header-secret-value token bearer-secret-value"
    assert "secret-value" not in redactor.redact(line)


def test_a_server_s_name_is_never_taken_for_a_secret() -> None:
    """`name = "postgres"` beside `PGUSER = "postgres"` (a standard Postgres setup) showed its
    tools as `[redacted].query` everywhere, approval prompts included."""
    value = [
        {
            "name": "postgres",
            "command": "srv",
            "env": {"PGUSER": "postgres", "PGPASSWORD": "pg-secret-value"},
        }
    ]
    settings = load_gateway_settings({"GATEWAY_MCP_SERVERS": json.dumps(value)})
    assert mcp_secrets(settings) == ["pg-secret-value"]

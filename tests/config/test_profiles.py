"""Agent profiles in the settings: TOML and variables, routes naming them, the default, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from config import Profile, Route, Settings, SettingsError, format_settings_error, load_settings
from config.profiles import allowed_tools

TOML = """
model = "openai:gpt-4.1-mini"
instructions = "You are the team's assistant."
max_attempts = 4

[[profiles]]
name = "oncall"
instructions = "You help the on-call engineer."
model = "anthropic:claude-sonnet-5-5"
allow_tools = ["deploys.*", "search_docs"]
deny_tools = ["deploys.rollback_all"]
approvers = ["U0ALICE"]

[[profiles]]
name = "support"
allow_tools = ["tickets.*"]
busy_policy = "follow_up"
max_attempts = 2

[[routes]]
channel = "slack"
space = "C0ONCALL"
session = "ops"
profile = "oncall"

[[routes]]
channel = "email"
space = "help@example.com"
session = "help"
profile = "support"

[[routes]]
channel = "web"
session = "web"
"""


def _load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Settings:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return load_settings(environ or {}, config_file=path)


def _problem(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(SettingsError) as caught:
        _load(tmp_path, text, environ)
    line = str(caught.value)
    assert "\n" not in line
    return line


def test_routes_name_profiles_and_other_threads_get_the_default(tmp_path: Path) -> None:
    settings = _load(tmp_path, TOML)
    oncall = settings.profile_for("slack", "C0ONCALL")
    assert oncall.name == "oncall"
    assert oncall.instructions == "You help the on-call engineer."
    assert oncall.model == "anthropic:claude-sonnet-5-5"
    assert oncall.approvers == ("U0ALICE",)
    assert (oncall.busy_policy, oncall.max_attempts) == ("steer", 4)  # the top level's
    support = settings.profile_for("email", "help@example.com")
    assert support.name == "support"
    assert support.instructions == "You are the team's assistant."  # unset: the top level's
    assert (support.model, support.busy_policy, support.max_attempts) == (None, "follow_up", 2)
    for channel, space in (("web", "anything"), ("slack", "C0OTHER")):
        default = settings.profile_for(channel, space)
        assert default.name == "default"
        assert default.instructions == "You are the team's assistant."
        assert default.allow_tools is None and default.approvers is None
        assert default.model is None  # the service's: GATEWAY_MODEL or the plugin's


def test_a_profile_named_default_is_the_default(tmp_path: Path) -> None:
    settings = _load(
        tmp_path, TOML + '[[profiles]]\nname = "default"\ndeny_tools = ["deploys.*"]\n'
    )
    default = settings.profile_for("web", "x")
    assert default.name == "default" and default.deny_tools == ("deploys.*",)
    assert default.instructions == "You are the team's assistant."
    assert settings.default_profile == default


def test_profiles_and_routes_from_variables(tmp_path: Path) -> None:
    environ = {
        "GATEWAY_PROFILES": json.dumps(
            [{"name": "triage", "instructions": "Sort the tickets.", "allow_tools": ["t.*"]}]
        ),
        "GATEWAY_ROUTES": json.dumps(
            [{"channel": "web", "space": "triage", "session": "t", "profile": "triage"}]
        ),
    }
    settings = _load(tmp_path, TOML, environ)  # the variables replace the file's lists
    assert [p.name for p in settings.profiles] == ["triage"]
    assert settings.profile_for("web", "triage").instructions == "Sort the tickets."
    assert settings.profile_for("slack", "C0ONCALL").name == "default"


def test_without_profiles_the_default_is_made_of_the_top_level() -> None:
    settings = Settings(busy_policy="next_run", max_attempts=5, max_turns=7)
    default = settings.profile_for("web", "default")
    assert default == Profile(name="default", busy_policy="next_run", max_attempts=5, max_turns=7)
    assert settings.profile_named("default") == default
    assert settings.profile_named("nope") is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ('profile = "support"', 'profile = "suport"'),
            "routes[1] names the profile 'suport', which is not defined (profiles: oncall, "
            "support)",
        ),
        (('name = "support"', 'name = "oncall"'), "are both named oncall"),
        (('name = "support"', 'name = "Support Team"'), "expected a profile name"),
        (('allow_tools = ["tickets.*"]', 'allow_tools = ["tickets *"]'), "not a tool-name"),
        (("max_attempts = 2", "max_attempts = 0"), "profiles[1].max_attempts=0"),
        (("max_attempts = 2", "max_attempts = 0"), "expected an integer from 1 to 20"),
        (
            ("max_attempts = 2", "max_turns = 0"),
            "expected an integer from 1 to 1000",
        ),
        (('busy_policy = "follow_up"', 'busy_policy = "later"'), "one of steer, follow_up"),
        (('allow_tools = ["tickets.*"]', 'allow_tool = ["tickets.*"]'), "unknown key"),
        (('allow_tools = ["tickets.*"]', "budget = 5"), "max_turns, token_budget"),
        (('model = "anthropic:claude-sonnet-5-5"', 'model = "claude"'), "provider:model_id"),
        (('approvers = ["U0ALICE"]', 'approvers = "U0ALICE"'), "a list of text"),
    ],
)
def test_a_bad_profile_is_one_line_naming_it(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    old, new = change
    assert old in TOML
    line = _problem(tmp_path, TOML.replace(old, new, 1))
    assert expected in line, line
    assert "gateway.toml" in line  # where it came from


def test_a_route_naming_no_profile_fails_when_built_directly() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(routes=(Route(channel="web", session="w", profile="ghost"),))
    line = format_settings_error(caught.value)
    assert "routes[0] names the profile 'ghost', which is not defined (profiles: none are" in line


def test_a_profile_variable_that_is_not_json_says_what_it_expects(tmp_path: Path) -> None:
    line = _problem(tmp_path, "", {"GATEWAY_PROFILES": "oncall"})
    assert "GATEWAY_PROFILES" in line and "a JSON list of profiles" in line


def test_tools_are_allowed_by_patterns_minus_the_denied() -> None:
    names = ("tickets.search", "tickets.delete", "search_docs", "deploys.run", "ticketsX")
    profile = Profile(name="p", allow_tools=("tickets.*", "search_docs"), deny_tools=("*.delete",))
    assert allowed_tools(profile, names) == ("tickets.search", "search_docs")
    assert allowed_tools(Profile(name="all"), names) == names
    assert allowed_tools(Profile(name="none", allow_tools=()), names) == ()
    assert not Profile(name="p", allow_tools=("Tickets.*",)).allows("tickets.search")


def test_the_digest_changes_with_any_field() -> None:
    base = Profile(name="p", instructions="a")
    assert base.digest() == Profile(name="p", instructions="a").digest()
    assert base.digest() != Profile(name="p", instructions="b").digest()
    assert base.digest() != Profile(name="p", instructions="a", max_attempts=2).digest()
    assert base.digest() != Profile(name="q", instructions="a").digest()

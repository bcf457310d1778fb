"""The channel registry: built-in specs, installed ones by entry point, sections read by name."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters import BUILT_IN, RegistryError, channel_specs
from adapters.slack.settings import SlackSettings
from config import SettingsError
from gateway import channels
from gateway.channels import build_channels, gateway_settings, load_gateway_settings
from harness_core.testing import ManualClock

ROOT = Path(__file__).resolve().parents[2]


def _install(site: Path, name: str, module: str, body: str) -> None:
    """An installed distribution whose entry point names `module:SPEC` (what pip leaves)."""
    (site / f"{module}.py").write_text(textwrap.dedent(body))
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[durable_gateway.channels]\n{name} = {module}:SPEC\n")


TOY = """
    from pydantic import Field
    from adapters.kit import ChannelSpec
    from adapters.testing import RecordingChannel
    from config.sections import Section

    class ToySettings(Section):
        greeting: str | None = Field(default=None, description="Turns the toy channel on.")
        rate: int = Field(default=3, ge=1, le=9, description="How often.")

    SPEC = ChannelSpec(
        name="toy",
        section=ToySettings,
        enabled=lambda section: section.greeting is not None,
        build=lambda section, context: RecordingChannel(name="toy"),
        describe=lambda section, context: [f"  Toy: says {section.greeting}"],
    )
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    channels.specs.cache_clear()
    yield tmp_path
    channels.specs.cache_clear()
    for name in [m for m in sys.modules if m.startswith("toy")]:
        del sys.modules[name]


def test_the_built_in_channels_load_with_defaults_that_keep_only_the_web_on() -> None:
    specs = channel_specs()[: len(BUILT_IN)]
    assert [spec.name for spec in specs] == ["web", "slack", "email", "webhook"]
    assert [spec.enabled(spec.section()) for spec in specs] == [True, False, False, False]


def test_an_installed_channel_is_read_built_and_described_by_its_entry_point(site: Path) -> None:
    _install(site, "toy", "toychannel", TOY)
    assert [spec.name for spec in channel_specs()][-1] == "toy"
    settings = load_gateway_settings({"GATEWAY_TOY_GREETING": "hi", "GATEWAY_TOY_RATE": "5"})
    section = settings.channels["toy"]
    assert (getattr(section, "greeting", None), getattr(section, "rate", None)) == ("hi", 5)
    built = build_channels(settings, ManualClock())
    assert [adapter.name for adapter in built] == ["web", "toy"]
    assert channels.channel_lines(settings, ManualClock())[-1] == "  Toy: says hi"
    with pytest.raises(SettingsError) as caught:
        load_gateway_settings({"GATEWAY_TOY_RATE": "12"})
    assert (
        str(caught.value)
        == "toy_rate='12' (GATEWAY_TOY_RATE in the environment): expected an integer from 1 to 9"
    )


def test_two_channels_of_one_name_are_refused(site: Path) -> None:
    _install(site, "slack", "toyslack", TOY.replace('name="toy"', 'name="slack"'))
    with pytest.raises(RegistryError, match="two channels are named 'slack'"):
        channel_specs()


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (TOY.replace('name="toy"', 'name="Toy_1"'), "expected 1-32 of a-z and 0-9"),
        ("SPEC = 42\n", "is not a ChannelSpec"),
        ("import no_such_module_here\n", "cannot be loaded"),
    ],
)
def test_a_broken_installed_channel_is_one_clear_error(site: Path, body: str, said: str) -> None:
    _install(site, "toy", "toybroken", body)
    with pytest.raises(RegistryError, match=said):
        channel_specs()


def test_a_section_is_a_toml_table_and_the_old_flat_keys_still_work(tmp_path: Path) -> None:
    table = tmp_path / "table.toml"
    table.write_text(
        '[slack]\nbot_token = "xoxb-1-2"\napp_token = "xapp-1-2"\n'
        '[slack.approvers]\nC0123 = ["U0456"]\n'
    )
    flat = tmp_path / "flat.toml"
    flat.write_text(
        'slack_bot_token = "xoxb-1-2"\nslack_app_token = "xapp-1-2"\n'
        '[slack_approvers]\nC0123 = ["U0456"]\n'
    )
    loaded = [load_gateway_settings({}, config_file=path) for path in (table, flat)]
    assert loaded[0] == loaded[1]
    slack = loaded[0].section("slack", SlackSettings)
    assert slack.approvers == {"C0123": ("U0456",)} and slack.enabled


def test_an_unknown_key_in_a_section_names_the_table_and_the_closest_key(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[slack]\nbot_tokn = "xoxb-1"\n')
    with pytest.raises(SettingsError) as caught:
        load_gateway_settings({}, config_file=config)
    assert str(caught.value) == (
        f"unknown setting 'bot_tokn' in the [slack] table of {config} line 2; "
        "did you mean bot_token?"
    )


def test_a_section_relation_names_the_settings_as_people_write_them() -> None:
    with pytest.raises(SettingsError) as caught:
        gateway_settings(email_address="bot@example.com", email_imap_host="imap.example.com")
    assert str(caught.value) == (
        "email_address=bot@example.com (given) and email_smtp_host=unset (default) and "
        "email_password=unset (default): the email channel needs email_smtp_host, "
        "email_password too (GATEWAY_EMAIL_SMTP_HOST, GATEWAY_EMAIL_PASSWORD, or the same keys "
        "without email_ under [email])"
    )


def test_reading_the_settings_imports_no_channel_library() -> None:
    probe = (
        "import sys; from gateway.channels import load_gateway_settings; "
        "load_gateway_settings({}); "
        "print(sorted(m for m in ('slack_bolt', 'slack_sdk', 'aioimaplib', 'aiosmtplib') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_section_given_as_a_value_says_to_write_a_table(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("slack = 3\n")
    with pytest.raises(SettingsError) as caught:
        load_gateway_settings({}, config_file=config)
    assert str(caught.value) == (
        f"slack in {config} line 1 is the slack channel's section: write its settings under a "
        "[slack] table"
    )

"""The example files name every setting, are what the model generates, and load as they are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from config.examples import EXAMPLE_FILES
from config.examples import env_example as env_text
from config.examples import toml_example as toml_text
from config.loader import settings_table
from gateway.channels import gateway_sections, gateway_settings
from gateway.channels import load_gateway_settings as load_settings
from gateway.examples import main

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = gateway_sections()
FIELDS = set(settings_table(SECTIONS))


def env_example() -> str:
    return env_text(SECTIONS)


def toml_example() -> str:
    return toml_text(SECTIONS)


def _uncommented(text: str) -> str:
    """The file with every setting line switched on (prose lines start with "# ")."""
    return "\n".join(
        line[1:] if line.startswith("#") and not line.startswith("# ") else line
        for line in text.splitlines()
    )


def test_the_env_example_names_exactly_the_settings() -> None:
    text = (ROOT / ".env.example").read_text()
    names = re.findall(r"^#GATEWAY_([A-Z0-9_]+)=", text, flags=re.MULTILINE)
    assert sorted(name.lower() for name in names) == sorted(FIELDS)


def test_the_toml_example_names_exactly_the_settings() -> None:
    text = (ROOT / "gateway.example.toml").read_text()
    names: set[str] = set()
    section = ""
    in_table = False  # the keys of a table setting's items ([[routes]]) are not settings
    for line in text.splitlines():
        if table := re.fullmatch(r"#\[\[?([a-z_.]+)\]\]?", line):
            name = table.group(1)
            in_table = name not in SECTIONS
            if name in SECTIONS:
                section = f"{name}_"
            else:  # a table setting: [[routes]], [[profiles]], [slack.approvers]
                names.add(name.replace(".", "_"))
        elif line.startswith("# "):
            in_table = False
        elif (key := re.match(r"#([a-z_]+) = ", line)) and not in_table:
            names.add(section + key.group(1))
    assert names == FIELDS


@pytest.mark.parametrize(
    ("name", "generate"), [(".env.example", env_example), ("gateway.example.toml", toml_example)]
)
def test_the_examples_are_generated_from_the_model(name: str, generate) -> None:
    assert (ROOT / name).read_text() == generate(), (
        f"{name} is stale: run `.venv/bin/python -m gateway.examples`"
    )


def test_every_setting_says_its_default_and_what_it_accepts() -> None:
    text = env_example()
    for name in FIELDS:
        block = text.split(f"#GATEWAY_{name.upper()}=")[0].rsplit("\n\n", 1)[-1]
        assert "Accepts " in block, name
        assert "efault" in block, name


def test_the_env_example_switched_on_loads(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text(_uncommented(env_example()))
    settings = load_settings({}, env_file=dotenv)
    assert settings.redis_url == "redis://localhost:6379/0"
    assert settings.route_for("email", "ops@example.com") == "ops"
    assert settings.route_for("web", "anything") == "web"


def test_the_toml_example_switched_on_loads_to_the_same_settings(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text(_uncommented(env_example()))
    config = tmp_path / "gateway.toml"
    config.write_text(_uncommented(toml_example()))
    assert load_settings({}, config_file=config) == load_settings({}, env_file=dotenv)


def test_the_examples_as_shipped_change_nothing(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(toml_example())
    dotenv = tmp_path / ".env"
    dotenv.write_text(env_example())
    assert load_settings({}, config_file=config, env_file=dotenv) == gateway_settings()


def test_main_writes_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 0
    assert [(tmp_path / name).read_text() for name in EXAMPLE_FILES] == [
        env_example(),
        toml_example(),
    ]
    assert capsys.readouterr().out.count("wrote ") == 2


def test_a_missing_or_unwritable_directory_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == f"examples: {tmp_path / 'nowhere'} is not a directory\n"
    assert main(["--help"]) == 0  # it said "--help is not a directory"
    assert capsys.readouterr().out.startswith("usage: python -m gateway.examples [DIR]")
    (tmp_path / EXAMPLE_FILES[0]).mkdir()  # a directory where the file must go
    assert main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"examples: cannot write {tmp_path / EXAMPLE_FILES[0]}: ")
    assert err.count("\n") == 1

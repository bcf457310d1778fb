"""The example files, generated from the settings model: ``.env.example``, ``gateway.example.toml``.

``python -m gateway.examples [DIR]`` writes both, with every registered channel's section
(`main` here takes the sections: config knows no channel), into the current directory by
default; a test fails when the files in the repository differ from what this module generates,
so they always name every setting with its default, its meaning and what it accepts.

Prose lines start with ``# ``; a setting line is commented with a bare ``#`` (``#GATEWAY_PORT=
8787``, ``#port = 8787``): delete that ``#`` to set it.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from config.fields import number
from config.loader import ENV_PREFIX, Setting, settings_table
from config.sections import Section

__all__ = ["EXAMPLE_FILES", "env_example", "main", "toml_example"]

EXAMPLE_FILES = (".env.example", "gateway.example.toml")

# what the example shows for a setting that is unset by default
_SAMPLES: dict[str, Any] = {
    "model_api_key": "sk-...",
    "model_base_url": "http://localhost:11434/v1",
    "model_max_output_tokens": 4096,
    "model_context_window": 32768,
    "token_budget": 2_000_000,
    "redis_url": "redis://localhost:6379/0",
    "broker_url": "redis://localhost:6379/0",
    "plugin": "mycompany.gateway_agent",
    "instructions": "You are the operations assistant of Example Corp. Answer briefly.",
    "profiles": [
        {
            "name": "oncall",
            "instructions": "You help the on-call engineer. Deploy only what you are asked to.",
            "model": "anthropic:claude-sonnet-5-5",
            "allow_tools": ["deploys.*", "search_docs"],
            "approvers": ["U0123ALICE", "U0456BOB"],
        },
        {
            "name": "support",
            "instructions": "You answer questions from customers. Never promise a refund.",
            "allow_tools": ["tickets.*", "search_docs"],
            "deny_tools": ["tickets.delete*"],
            "busy_policy": "follow_up",
            "max_attempts": 2,
            "token_budget": 500_000,
        },
    ],
    "routes": [
        {"channel": "slack", "space": "C0123456789", "session": "ops", "profile": "oncall"},
        {"channel": "email", "space": "ops@example.com", "session": "ops", "profile": "support"},
        {"channel": "web", "space": "*", "session": "web"},
    ],
    "public_url": "https://gateway.example.com",
    "allowed_hosts": ["gateway.internal.example.com"],
    "ops_tokens": [
        "alice:operator:change-me-to-a-long-random-secret",
        "dashboard:viewer:change-me-to-another-long-secret",
    ],
}
_WIDTH = 100


def env_example(sections: Mapping[str, type[Section]] | None = None) -> str:
    """The text of ``.env.example`` (with every channel section's settings)."""
    lines = [
        *_prose(
            "The gateway's settings as environment variables: every one, with its default. "
            "Generated from the settings models by `python -m gateway.examples`; do not edit. "
            "Copy to .env (or export the variables) and delete the # before a setting to set "
            "it. Strongest first: the environment, then .env, then `gateway serve --config "
            "FILE.toml`, then the defaults. A GATEWAY_* name that is no setting, or a variable "
            "that is set but empty, stops the gateway with one line saying why. Values are "
            "literal (no ${VAR} expansion)."
        ),
    ]
    for name, setting in settings_table(sections).items():
        value = _sample(setting)
        json_value = setting.json_example is not None
        text = json.dumps(value, separators=(",", ":")) if json_value else _text(value)
        quoted = f"'{text}'" if json_value else text
        lines += ["", *_about(setting), f"#{ENV_PREFIX}{name.upper()}={quoted}"]
    return "\n".join(lines) + "\n"


def toml_example(sections: Mapping[str, type[Section]] | None = None) -> str:
    """The text of ``gateway.example.toml`` (a ``[<channel>]`` table per section)."""
    lines = [
        *_prose(
            "The gateway's settings as a TOML file for `gateway serve --config FILE`: every "
            "one, with its default. Generated from the settings models by `python -m "
            "gateway.examples`; do not edit. Delete the # before a setting to set it. GATEWAY_* "
            "environment variables (and .env) override what this file sets; a key that is no "
            "setting stops the gateway with one line saying why. Relative paths in URLs are "
            "relative to the current directory, not to this file. A channel's settings are "
            "its table ([slack], [email]...): bot_token in [slack] is GATEWAY_SLACK_BOT_TOKEN."
        ),
    ]
    table = settings_table(sections)
    groups: dict[str | None, list[Setting]] = {}
    for setting in table.values():
        groups.setdefault(setting.section, []).append(setting)
    for section, members in groups.items():
        plain = [s for s in members if s.json_example is None]
        tables = [s for s in members if s.json_example is not None]
        if section is not None:
            lines += ["", f"#[{section}]"]
        for setting in plain:
            lines += ["", *_about(setting), f"#{setting.field} = {_toml(_sample(setting))}"]
        for setting in tables:  # TOML: tables come after every plain key
            lines += ["", *_about(setting)]
            sample = _sample(setting)
            name = setting.field if section is None else f"{section}.{setting.field}"
            if isinstance(sample, dict):
                lines += [f"#[{name}]", *(f"#{_key(k)} = {_toml(v)}" for k, v in sample.items())]
                continue
            for index, item in enumerate(sample):
                lines += [""] if index else []
                lines += [f"#[[{name}]]", *(f"#{key} = {_toml(v)}" for key, v in item.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, sections: Mapping[str, type[Section]] | None = None) -> int:
    """Write both example files into the directory named by the first argument (or ``.``)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):  # it was read as a directory named "--help"
        print(
            "usage: python -m gateway.examples [DIR]: write .env.example and "
            "gateway.example.toml into DIR (default: the current directory)"
        )
        return 0
    target = Path(args[0] if args else ".")
    if not target.is_dir():
        print(f"examples: {target} is not a directory", file=sys.stderr)
        return 2
    texts = (env_example(sections), toml_example(sections))
    for name, text in zip(EXAMPLE_FILES, texts, strict=True):
        try:
            (target / name).write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"examples: cannot write {target / name}: {exc.strerror}", file=sys.stderr)
            return 1
        print(f"wrote {target / name}")
    return 0


def _about(setting: Setting) -> Iterator[str]:
    description = str(setting.model.model_fields[setting.field].description)
    default = setting.default_text()
    if "(default:" in description:
        shown = ""  # the description says it better
    elif default in ("unset", "none"):
        shown = f" Default: {default} (the line below is an example)."
    else:
        shown = f" Default: {default}."
    yield from _prose(f"{description}{shown} Accepts {setting.accepted()}.")


def _prose(text: str) -> list[str]:
    return textwrap.wrap(
        text,
        width=_WIDTH,
        initial_indent="# ",
        subsequent_indent="# ",
        break_on_hyphens=False,
        break_long_words=False,
    )


def _sample(setting: Setting) -> Any:
    default = setting.default()
    if default is not None and default not in ((), {}):
        return default
    if issubclass(setting.model, Section):
        return setting.model.EXAMPLES[setting.field]
    return _SAMPLES[setting.name]


def _key(key: str) -> str:
    """A TOML key: bare when it can be, else quoted (``"*"``)."""
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _text(value: Any) -> str:
    """A value as a variable holds it (30, not 30.0; true; a list comma-separated)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float | int):
        return number(value)
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def _toml(value: Any) -> str:
    if isinstance(value, dict):  # an inline table (a server's env, its overrides)
        return "{ " + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | list):
        return json.dumps(value)  # TOML basic strings and arrays, for the ASCII text used here
    return _text(value)

"""The example files, generated from the settings model: ``.env.example``, ``gateway.example.toml``.

``python -m config.examples [DIR]`` writes both (into the current directory by default); a test
fails when the files in the repository differ from what this module generates, so they always
name every setting with its default, its meaning and what it accepts.

Prose lines start with ``# ``; a setting line is commented with a bare ``#`` (``#GATEWAY_PORT=
8787``, ``#port = 8787``): delete that ``#`` to set it.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from config.loader import ENV_PREFIX
from config.settings import Settings, accepted, default_text, number

__all__ = ["EXAMPLE_FILES", "env_example", "main", "toml_example"]

EXAMPLE_FILES = (".env.example", "gateway.example.toml")

# what the example shows for a setting that is unset by default
_SAMPLES: dict[str, Any] = {
    "model_api_key": "sk-...",
    "model_base_url": "http://localhost:11434/v1",
    "model_max_output_tokens": 4096,
    "redis_url": "redis://localhost:6379/0",
    "broker_url": "redis://localhost:6379/0",
    "web_url": "redis://localhost:6379/0",
    "plugin": "mycompany.gateway_agent",
    "routes": [
        {"channel": "slack", "space": "C0123456789", "session": "ops"},
        {"channel": "email", "space": "ops@example.com", "session": "ops"},
        {"channel": "web", "space": "*", "session": "web"},
    ],
    "slack_bot_token": "xoxb-...",
    "slack_signing_secret": "...",
    "slack_app_token": "xapp-...",
    "slack_approvers": {"C0123456789": ["U0123456789", "S0123456789"], "*": ["U0987654321"]},
    "email_address": "agent@example.com",
    "email_imap_host": "imap.example.com",
    "email_smtp_host": "smtp.example.com",
    "email_username": "agent@example.com",
    "email_password": "...",
    "email_ca_file": "/etc/ssl/private-ca.pem",
    "email_approvers": ["ops-lead@example.com"],
    "email_link_secret": "a-random-secret-of-at-least-32-characters",
    "public_url": "https://gateway.example.com",
    "allowed_hosts": ["gateway.internal.example.com"],
    "ops_tokens": [
        "alice:operator:change-me-to-a-long-random-secret",
        "dashboard:viewer:change-me-to-another-long-secret",
    ],
}
_JSON = ("routes", "slack_approvers")
"""Settings whose variable holds JSON (and TOML tables)."""
_WIDTH = 100


def env_example() -> str:
    """The text of ``.env.example``."""
    lines = [
        *_prose(
            "The gateway's settings as environment variables: every one, with its default. "
            "Generated from config/settings.py by `python -m config.examples`; do not edit. "
            "Copy to .env (or export the variables) and delete the # before a setting to set "
            "it. Strongest first: the environment, then .env, then `gateway serve --config "
            "FILE.toml`, then the defaults. A GATEWAY_* name that is no setting, or a variable "
            "that is set but empty, stops the gateway with one line saying why. Values are "
            "literal (no ${VAR} expansion)."
        ),
    ]
    for name in Settings.model_fields:
        value = _sample(name)
        text = json.dumps(value, separators=(",", ":")) if name in _JSON else _text(value)
        quoted = f"'{text}'" if name in _JSON else text
        lines += ["", *_about(name), f"#{ENV_PREFIX}{name.upper()}={quoted}"]
    return "\n".join(lines) + "\n"


def toml_example() -> str:
    """The text of ``gateway.example.toml``."""
    lines = [
        *_prose(
            "The gateway's settings as a TOML file for `gateway serve --config FILE`: every "
            "one, with its default. Generated from config/settings.py by `python -m "
            "config.examples`; do not edit. Delete the # before a setting to set it. GATEWAY_* "
            "environment variables (and .env) override what this file sets; a key that is no "
            "setting stops the gateway with one line saying why. Relative paths in URLs are "
            "relative to the current directory, not to this file."
        ),
    ]
    tables = [name for name in Settings.model_fields if name in _JSON]
    for name in [name for name in Settings.model_fields if name not in tables]:
        lines += ["", *_about(name), f"#{name} = {_toml(_sample(name))}"]
    for name in tables:  # TOML: tables come after every plain key
        lines += ["", *_about(name)]
        sample = _sample(name)
        if isinstance(sample, dict):
            lines += [f"#[{name}]", *(f"#{_key(k)} = {_toml(v)}" for k, v in sample.items())]
            continue
        for index, table in enumerate(sample):
            lines += [""] if index else []
            lines += [f"#[[{name}]]", *(f"#{key} = {_toml(item)}" for key, item in table.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write both example files into the directory named by the first argument (or ``.``)."""
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0] if args else ".")
    if not target.is_dir():
        print(f"config.examples: {target} is not a directory", file=sys.stderr)
        return 2
    for name, text in zip(EXAMPLE_FILES, (env_example(), toml_example()), strict=True):
        try:
            (target / name).write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"config.examples: cannot write {target / name}: {exc.strerror}", file=sys.stderr)
            return 1
        print(f"wrote {target / name}")
    return 0


def _about(name: str) -> Iterator[str]:
    description = str(Settings.model_fields[name].description)
    default = default_text(name)
    if "(default:" in description:
        shown = ""  # the description says it better
    elif default in ("unset", "none"):
        shown = f" Default: {default} (the line below is an example)."
    else:
        shown = f" Default: {default}."
    yield from _prose(f"{description}{shown} Accepts {accepted(name)}.")


def _prose(text: str) -> list[str]:
    return textwrap.wrap(
        text,
        width=_WIDTH,
        initial_indent="# ",
        subsequent_indent="# ",
        break_on_hyphens=False,
        break_long_words=False,
    )


def _sample(name: str) -> Any:
    default = Settings.model_fields[name].get_default(call_default_factory=True)
    return _SAMPLES[name] if default is None or default in ((), {}) else default


def _key(key: str) -> str:
    """A TOML key: bare when it can be, else quoted (``"*"``)."""
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _text(value: Any) -> str:
    """A value as a variable holds it (30, not 30.0; a list comma-separated)."""
    if isinstance(value, float | int) and not isinstance(value, bool):
        return number(value)
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def _toml(value: Any) -> str:
    if isinstance(value, str | list):
        return json.dumps(value)  # TOML basic strings and arrays, for the ASCII text used here
    return _text(value)


if __name__ == "__main__":
    raise SystemExit(main())

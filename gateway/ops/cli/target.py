"""Where the gateway is and who we are: its URL and token (flags, environment, settings)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from pathlib import Path

import httpx
from pydantic import ValidationError

from config import Settings, SettingsError, format_settings_error
from gateway.channels import load_gateway_settings, served_url
from gateway.ops.address import address_file, connect_host, kept_address
from gateway.ops.cli.errors import USAGE, OpsError
from gateway.ops.cli.output import clean
from harness_core.backends.urls import without_password

__all__ = ["API", "TOKEN_VARIABLE", "URL_VARIABLE", "Target", "on_this_machine"]

API = "/api/v1"
URL_VARIABLE = "GATEWAY_OPS_URL"
TOKEN_VARIABLE = "GATEWAY_OPS_TOKEN"
_CLIENT_VARIABLES = frozenset({URL_VARIABLE, TOKEN_VARIABLE})


class Target:
    """The gateway's URL and the token, from the flags, the environment or the settings."""

    def __init__(self, args: argparse.Namespace, settings: Settings | None) -> None:
        self._args = args
        self._settings = settings
        self._settings_error: str | None = None
        self.token_file_problem: str | None = None
        """Why the local token file is there but could not be read (its owner's, say)."""
        self.url = self._url()
        self.token, self.token_source = self._token()

    def settings(self) -> Settings:
        """The settings `gateway serve` reads (the client's own variables left out)."""
        if self._settings_error is not None:
            raise OpsError(self._settings_error, USAGE)
        if self._settings is None:
            # GATEWAY_OPS_URL / GATEWAY_OPS_TOKEN are this client's, not settings: the loader
            # would call them unknown
            environ = {k: v for k, v in os.environ.items() if k.upper() not in _CLIENT_VARIABLES}
            dotenv = Path(".env")
            try:
                self._settings = load_gateway_settings(
                    environ,
                    config_file=self._args.config,
                    env_file=dotenv if dotenv.is_file() else None,
                )
                store = getattr(self._args, "store", None)
                if store is not None:  # as `serve --store` was given: its token file
                    self._settings = self._settings.replace(store_url=store)
            except (SettingsError, ValidationError) as exc:  # a bad --store: ValidationError
                self._settings_error = (
                    f"cannot read the settings ({format_settings_error(exc)}); "
                    "pass --url and --token to do without them"
                )
                raise OpsError(self._settings_error, USAGE) from None
        return self._settings

    def token_file(self) -> Path | None:
        """Where the embedded service keeps its operator token (None: no such file)."""
        from gateway.ops.auth import token_file

        try:
            path = token_file(self.settings().effective_store_url)
        except OpsError:
            return None
        return path.absolute() if path is not None else None

    def _url(self) -> str:
        given = self._args.url or os.environ.get(URL_VARIABLE, "").strip()
        if given:
            source = "--url" if self._args.url else URL_VARIABLE
        else:
            settings = self.settings()
            kept = address_file(settings.effective_store_url)
            served = kept_address(kept)
            if served is not None:  # where the serve of this store listens, --port and all
                given, source = served, f"the address kept in {kept}"
            else:
                given = served_url(settings, connect_host(settings.host))
                source = "the settings"
        url = given.strip().rstrip("/")
        url = url.removesuffix(API).rstrip("/")
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError):
            parsed = None
        port_ok = True
        if parsed is not None:
            try:
                port_ok = parsed.port is None or 1 <= parsed.port <= 65535
            except ValueError:
                port_ok = False
        if (
            parsed is None
            or parsed.scheme not in ("http", "https")
            or not parsed.host
            or not port_ok
            # a user, a path, a query or a fragment: the token was displaced by the user, or
            # the routes were looked for under the path ("no such route")
            or parsed.userinfo
            or parsed.path not in ("", "/")
            or parsed.query
            or parsed.fragment
        ):
            raise OpsError(
                f"{source} must be the gateway's address like http://127.0.0.1:8787, "
                f"not {clean(without_password(given))!r}",
                USAGE,
            )
        return url

    def sent_token(self) -> str | None:
        """What the Authorization header carries: the token, or a proof for the local file's.

        The local token file's token itself goes to no port: a proof bound to the port called
        does (D381).
        """
        if self.token is None or not self.token_source.startswith("the token file"):
            return self.token
        from gateway.ops.auth import port_bound

        url = httpx.URL(self.url)
        return port_bound(self.token, url.port or (443 if url.scheme == "https" else 80))

    def _token(self) -> tuple[str | None, str]:
        token, source = self._found_token()
        if token is not None and not re.fullmatch(r"[!-~]+", token):
            raise OpsError(f"the token from {source} is not one line of visible ASCII", USAGE)
        return token, source

    def _found_token(self) -> tuple[str | None, str]:
        if self._args.token:
            return self._args.token.strip(), "--token"
        from_env = os.environ.get(TOKEN_VARIABLE, "").strip()
        if from_env:
            return from_env, TOKEN_VARIABLE
        path = self.token_file()
        if path is not None and on_this_machine(self.url):
            try:
                text = path.read_text(encoding="ascii").strip()
            except FileNotFoundError:
                text = ""
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else "not ASCII"
                self.token_file_problem = f"{path} is there but cannot be read ({reason})"
                text = ""
            if text:
                return text, f"the token file {path}"
        return None, ""


def on_this_machine(url: str) -> bool:
    """Whether `url` names a loopback address: the local gateway's token goes nowhere else.

    The token file is the embedded gateway's; sent to another address (a typo in ``--url``, a
    server someone else runs) it would hand that server the local gateway's operator rights.
    """
    host = httpx.URL(url).host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

"""Configuration: the service's settings, read once by the entry point and passed down.

`load_settings` reads ``GATEWAY_*`` variables, a ``.env`` file and a TOML file (strongest first)
into a checked, frozen `Settings`; every bad input is one `SettingsError` line.
"""

from config.loader import SettingsError, UnknownSetting, format_settings_error, load_settings
from config.profiles import Profile
from config.settings import (
    DEFAULT_BROKER_URL,
    DEFAULT_STORE_URL,
    BusyPolicy,
    LogLevel,
    Route,
    Settings,
)

__all__ = [
    "BusyPolicy",
    "DEFAULT_BROKER_URL",
    "DEFAULT_STORE_URL",
    "format_settings_error",
    "load_settings",
    "LogLevel",
    "Profile",
    "Route",
    "Settings",
    "SettingsError",
    "UnknownSetting",
]

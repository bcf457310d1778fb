"""Configuration: pydantic-settings models, loaded once by the entry point and passed down."""

from config.settings import Settings, UnknownSetting, load_settings

__all__ = ["load_settings", "Settings", "UnknownSetting"]

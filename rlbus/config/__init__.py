"""Every config section, in one leaf package (it imports only pydantic): the settings each
process shares, and the tables of environments, orchestrator, trainer and whole runs. Each
field's docstring is its help text."""

from rlbus.config.base import ConfigError, Section
from rlbus.config.loading import (
    deep_merge,
    format_validation_error,
    load_settings,
    parse_overrides,
    settings_variables,
)
from rlbus.config.settings import (
    DATA_DIR,
    DEFAULT_STORE_URL,
    ClaimCheckConfig,
    KafkaConfig,
    Settings,
    StoreConfig,
    TelemetryConfig,
    data_dir,
)

__all__ = [
    "DATA_DIR",
    "DEFAULT_STORE_URL",
    "ClaimCheckConfig",
    "ConfigError",
    "KafkaConfig",
    "Section",
    "Settings",
    "StoreConfig",
    "TelemetryConfig",
    "data_dir",
    "deep_merge",
    "format_validation_error",
    "load_settings",
    "parse_overrides",
    "settings_variables",
]

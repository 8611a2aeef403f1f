"""Deprecated name of `rlbus.producers.environment` (renamed so the environment definition is
not confused with the env producer, `rlbus.producers.env_producer`). Kept for environments
written against it; it will be removed in a later release."""

import warnings

from rlbus.producers.environment import *  # noqa: F403
from rlbus.producers.environment import __all__  # noqa: F401

warnings.warn(
    "rlbus.producers.env is now rlbus.producers.environment; update the import",
    DeprecationWarning,
    stacklevel=2,
)

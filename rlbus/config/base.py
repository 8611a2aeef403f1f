"""What every config section shares: unknown fields are errors, and each field's docstring is
its help text (`rlbus config`, the CLI)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ConfigError(ValueError):
    """A config problem, with the offending field named."""

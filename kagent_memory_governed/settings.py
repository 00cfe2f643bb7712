"""Configuration from the environment (prefix ``KAGENT_GOVERNED_MEMORY_``), validated once at start-up."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kagent_memory_governed.policy import Policy

PREFIX = "KAGENT_GOVERNED_MEMORY_"
# Read by this repository's tooling, not by the package: ./dev and the test suite.
TOOLING = {
    "KAGENT_GOVERNED_MEMORY_VENV",
    "KAGENT_GOVERNED_MEMORY_TEST_DATABASE_URL",
    "KAGENT_GOVERNED_MEMORY_RACE_TRIALS",
}


class Settings(BaseSettings):
    """Everything an operator sets. Unset database URL: an embedded PostgreSQL for local runs only."""

    model_config = SettingsConfigDict(env_prefix="KAGENT_GOVERNED_MEMORY_", extra="ignore", frozen=True)

    database_url: str | None = None
    data_dir: Path = Field(default_factory=lambda: platformdirs.user_data_path("kagent-memory-governed"))
    bridge_public_key: str | None = None
    bridge_issuer: str | None = None
    homeserver: str | None = None
    policy: Path | None = None
    kagent_namespace: str | None = Field(default=None, validation_alias="KAGENT_NAMESPACE")
    kagent_name: str | None = Field(default=None, validation_alias="KAGENT_NAME")

    @field_validator("database_url")
    @classmethod
    def _asyncpg_only(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("postgresql+asyncpg://"):
            raise ValueError("KAGENT_GOVERNED_MEMORY_DATABASE_URL must be a postgresql+asyncpg:// URL")
        return value

    @model_validator(mode="after")
    def _no_unknown_variables(self) -> Settings:
        # a misspelt DATABASE_URL would otherwise fall back to the embedded database without a word
        known = {PREFIX + name.upper() for name in type(self).model_fields if not name.startswith("kagent_")}
        unknown = sorted(k for k in os.environ if k.startswith(PREFIX) and k not in known | TOOLING)
        if unknown:
            raise ValueError(f"unknown setting {unknown[0]}")
        return self

    def load_policy(self) -> Policy:
        """The effective policy: the ceilings, lowered by the policy file if one is configured."""
        return Policy.from_file(self.policy) if self.policy else Policy()

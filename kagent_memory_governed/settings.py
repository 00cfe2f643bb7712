"""Configuration from the environment (prefix ``KAGENT_GOVERNED_MEMORY_``), validated once at start-up."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kagent_memory_governed.policy import Policy


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

    def load_policy(self) -> Policy:
        """The effective policy: the ceilings, lowered by the policy file if one is configured."""
        return Policy.from_file(self.policy) if self.policy else Policy()

"""Configuration from the environment (prefix ``KAGENT_GOVERNED_MEMORY_``), validated once at start-up."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kagent_memory_governed.assertion import Trust
from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId

ENV_PREFIX = "KAGENT_GOVERNED_MEMORY_"
# Read by this repository's tooling, not by the package: ./dev and the test suite.
TOOLING = {
    "KAGENT_GOVERNED_MEMORY_VENV",
    "KAGENT_GOVERNED_MEMORY_TEST_DATABASE_URL",
    "KAGENT_GOVERNED_MEMORY_RACE_TRIALS",
    "KAGENT_GOVERNED_MEMORY_TEST_SERVICE",
}


SWITCH = "KAGENT_GOVERNED_MEMORY"  # the activation switch (kagent_memory_governed.activation)


def _looks_like_ours(name: str) -> bool:
    upper = name.upper()
    return "GOVERNED" in upper and "MEMORY" in upper


def in_kubernetes_pod() -> bool:
    """Whether this process runs in a Kubernetes pod (the kubelet sets this variable in every container)."""
    return "KUBERNETES_SERVICE_HOST" in os.environ


def problems(error: ValidationError) -> str:
    """A settings error on one line: what each problem is about and, for this package's own checks (which
    name settings and parameters, never values), what is wrong. Pydantic's messages may quote input: not kept."""
    found = []
    for problem in error.errors():
        field = str(problem["loc"][0]) if problem["loc"] else ""
        where = field if field.isupper() or not field else ENV_PREFIX + field.upper()  # the variable, as set
        ours = problem["type"] == "value_error" and isinstance(problem.get("ctx", {}).get("error"), ValueError)
        message = problem["msg"].removeprefix("Value error, ") if ours else ""
        if where and message.startswith(ENV_PREFIX):
            where = ""  # the message names the variable itself
        found.append(": ".join(part for part in (where, message) if part) or "invalid")
    return "; ".join(found)


class Settings(BaseSettings):
    """Everything an operator sets. Unset database URL: an embedded PostgreSQL for local runs only."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    database_url: SecretStr | None = None  # may carry a password: repr and str show neither
    data_dir: Path = Field(default_factory=lambda: platformdirs.user_data_path("kagent-memory-governed"))
    bridge_public_key: str | None = None
    bridge_issuer: str | None = None
    homeserver: str | None = None
    policy: Path | None = None
    embedded: bool = False  # inside a Kubernetes pod, the embedded PostgreSQL only when asked for
    key_store: str | None = None  # where entry keys live (kagent_memory_governed.keys); unset: <data dir>/keys
    key_store_token: SecretStr | None = None  # an OpenBao token, or @/path to a file an agent keeps renewed
    key_store_ca: Path | None = None  # CA bundle for openbao+https
    # ``serve``, the memory service (kagent_memory_governed/service/process.py)
    data_plane_address: str = "0.0.0.0:9443"  # gRPC, for agent runtimes
    control_address: str = "0.0.0.0:8443"  # /memory/v1 and /memory/ready, for the bridge
    tls_cert: Path | None = None  # the service's serving certificate chain (PEM); plaintext on loopback only
    tls_key: Path | None = None
    identity_issuer: str | None = None  # the API server's --service-account-issuer
    identity_audience: str = "governed-memory"  # the audience of the agents' projected tokens
    identity_api_server: str = "https://kubernetes.default.svc"
    identity_ca: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    identity_token: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    identity_agents: str | None = None  # <ns>/<service account>=<ns>/<agent>,...; unset: each account is its agent
    embeddings: Path | None = None  # JSON: each agent's embedding model (kagent_memory_governed/embedding.py)
    # an agent runtime in remote mode (kagent_memory_governed/service/remote.py): memory only through the service
    service_url: str | None = None  # https://host:port of the service's data plane; unset: the in-process store
    service_ca: Path | None = None  # the PEM CA the service's certificate is verified against (https://)
    service_token: Path = Path("/var/run/secrets/governed-memory/token")  # the projected token naming this agent
    in_process: bool = False  # inside a Kubernetes pod, the in-process store (every scope's credentials) when asked
    kagent_namespace: str | None = Field(default=None, validation_alias="KAGENT_NAMESPACE")
    kagent_name: str | None = Field(default=None, validation_alias="KAGENT_NAME")

    @model_validator(mode="after")
    def _remote_holds_no_credential(self) -> Settings:
        # a runtime that reaches memory through the service must not hold what the service alone holds
        if self.service_url is not None:
            held = [
                ENV_PREFIX + name.upper()
                for name in ("database_url", "key_store", "key_store_token", "key_store_ca")
                if getattr(self, name) is not None
            ]
            if held or self.in_process:
                also = held[0] if held else ENV_PREFIX + "IN_PROCESS"
                raise ValueError(f"{ENV_PREFIX}SERVICE_URL is set: the runtime holds no {also}")
        return self

    def remote(self) -> bool:
        """Whether this agent runtime reaches memory through the governed memory service only."""
        return self.service_url is not None

    @model_validator(mode="after")
    def _no_unknown_variables(self) -> Settings:
        # a misspelt DATABASE_URL would otherwise fall back to the embedded database without a word:
        # any variable that looks like ours (GOVERNED and MEMORY in its name, any case) must be ours exactly
        known = {ENV_PREFIX + name.upper() for name in type(self).model_fields if not name.startswith("kagent_")}
        known |= TOOLING | {SWITCH}
        lookalikes = sorted(k for k in os.environ if _looks_like_ours(k) and k not in known)
        if lookalikes:
            raise ValueError(f"unknown setting {lookalikes[0]}")
        return self

    @classmethod
    def load(cls) -> Settings:
        """The settings from the environment; ``ConfigurationError`` naming what is wrong, never a value."""
        try:
            return cls()
        except ValidationError as error:
            raise ConfigurationError(f"invalid settings: {problems(error)}") from None

    def load_policy(self) -> Policy:
        """The effective policy: the ceilings, lowered by the policy file if one is configured."""
        return Policy.from_file(self.policy) if self.policy else Policy()

    def bridge_key(self) -> Ed25519PublicKey:
        """The bridge's public key. Refuses (``ConfigurationError``, naming the setting, with a ``code``)
        a missing, unreadable or non-Ed25519 key and one that is not a point of prime order."""
        name = ENV_PREFIX + "BRIDGE_PUBLIC_KEY"
        if not self.bridge_public_key:
            raise ConfigurationError(f"governed memory needs {name}", code="missing")
        try:
            return Trust.load_public_key(self.bridge_public_key)
        except OSError:
            raise ConfigurationError(f"{name}: unreadable", code="unreadable") from None
        except (ValueError, TypeError):
            message = f"{name}: not an Ed25519 public key (PEM) of prime order"
            raise ConfigurationError(message, code="not_ed25519_public_key") from None

    def agent(self) -> AgentId:
        """This agent's ``<namespace>/<name>`` from kagent's ``KAGENT_NAMESPACE`` and ``KAGENT_NAME``."""
        if not self.kagent_namespace or not self.kagent_name:
            raise ConfigurationError("governed memory needs KAGENT_NAMESPACE, KAGENT_NAME", code="missing")
        try:
            return AgentId.parse(f"{self.kagent_namespace}/{self.kagent_name}")
        except GovernedMemoryError:
            raise ConfigurationError(
                "KAGENT_NAMESPACE/KAGENT_NAME: not a valid agent identity", code="invalid"
            ) from None

    def trust(self) -> Trust:
        """What every scope header and control token is verified against: the bridge's key and issuer,
        this agent, the local homeserver. Refuses incomplete or invalid settings, naming them, never values."""
        missing = [
            name
            for name, value in (
                (ENV_PREFIX + "BRIDGE_PUBLIC_KEY", self.bridge_public_key),
                (ENV_PREFIX + "BRIDGE_ISSUER", self.bridge_issuer),
                (ENV_PREFIX + "HOMESERVER", self.homeserver),
                ("KAGENT_NAMESPACE", self.kagent_namespace),
                ("KAGENT_NAME", self.kagent_name),
            )
            if not value
        ]
        if missing or self.bridge_issuer is None or self.homeserver is None:
            raise ConfigurationError(f"governed memory needs {', '.join(missing)}", code="missing")
        return Trust(self.bridge_key(), self.bridge_issuer, self.agent(), self.homeserver)

"""The adapters: each of kagent-adk's model adapters, as an ``AgentConfig`` model and the environment that
point it at a :class:`Provider`, and the releases that have it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import pytest

from ._provider import Provider

RELEASE = version("kagent-adk")
"""The kagent-adk release this interpreter runs."""


@dataclass(frozen=True)
class Adapter:
    """One of kagent-adk's model adapters, configured for a :class:`Provider`.

    ``model(provider)`` is the ``model`` dict of kagent's ``AgentConfig`` (``type``, ``model`` and the
    ``settings`` that point it at the provider); ``environment(provider)`` the variables the adapter's client
    reads (None: must be unset); ``apply`` sets them with a monkeypatch, before kagent builds the agent.
    ``errors`` says how a provider error reaches kagent from the adapter: ``response`` (an ``LlmResponse``
    with ``error_code``/``error_message``) or ``exception`` (raised out of ``generate_content_async``)."""

    name: str
    type: str
    protocol: str
    releases: tuple[str, ...]
    errors: str
    model_name: str
    streams: bool = True
    settings: Callable[[Provider], dict[str, Any]] = field(default=lambda provider: {}, repr=False)
    variables: Callable[[Provider], dict[str, str | None]] = field(default=lambda provider: {}, repr=False)

    def model(self, provider: Provider) -> dict[str, Any]:
        """The ``model`` of an ``AgentConfig`` that reaches ``provider``."""
        return {"type": self.type, "model": self.model_name, **self.settings(provider)}

    def environment(self, provider: Provider) -> dict[str, str | None]:
        """The variables the adapter's client reads, None for those that must be unset."""
        return {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", **self.variables(provider)}

    def apply(self, provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
        """Sets :meth:`environment` for the test, unsetting what it maps to None."""
        for name, value in self.environment(provider).items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)

    @property
    def available(self) -> bool:
        """Whether the running kagent-adk release has this adapter."""
        return RELEASE in self.releases


_BOTH = ("0.9.11", "0.10.4")

_GOOGLE_UNSET: dict[str, str | None] = {
    "GOOGLE_GENAI_USE_VERTEXAI": None,
    "GOOGLE_GENAI_USE_ENTERPRISE": None,
    "GOOGLE_CLOUD_PROJECT": None,
    "GOOGLE_CLOUD_LOCATION": None,
    "GOOGLE_API_KEY": None,
    "GEMINI_API_KEY": None,
    "GOOGLE_GEMINI_BASE_URL": None,
    "GOOGLE_VERTEX_BASE_URL": None,
    "GOOGLE_APPLICATION_CREDENTIALS": None,
}

ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter
    for adapter in (
        Adapter(
            name="openai",
            type="openai",
            protocol="openai",
            releases=_BOTH,
            errors="response",
            model_name="gpt-4o-mini",
            settings=lambda p: {"base_url": f"{p.url}/v1"},
            variables=lambda p: {"OPENAI_API_KEY": "sk-loopback"},
        ),
        Adapter(
            name="openai_responses",
            type="openai",
            protocol="openai_responses",
            releases=("0.10.4",),
            errors="response",
            model_name="gpt-4o-mini",
            settings=lambda p: {"base_url": f"{p.url}/v1", "api_format": "responses"},
            variables=lambda p: {"OPENAI_API_KEY": "sk-loopback"},
        ),
        Adapter(
            name="azure_openai",
            type="azure_openai",
            protocol="azure_openai",
            releases=_BOTH,
            errors="response",
            model_name="loopback-deployment",
            variables=lambda p: {
                "AZURE_OPENAI_ENDPOINT": p.url,
                "AZURE_OPENAI_API_KEY": "loopback",
                "OPENAI_API_VERSION": "2024-10-21",
                "AZURE_OPENAI_AD_TOKEN": None,
            },
        ),
        Adapter(
            name="anthropic",
            type="anthropic",
            protocol="anthropic",
            releases=_BOTH,
            errors="exception",
            model_name="claude-sonnet-4-6",
            settings=lambda p: {"base_url": p.url},
            variables=lambda p: {"ANTHROPIC_API_KEY": "sk-ant-loopback", "ANTHROPIC_AUTH_TOKEN": None},
        ),
        Adapter(
            name="ollama",
            type="ollama",
            protocol="ollama",
            releases=_BOTH,
            errors="response",
            model_name="llama3.2",
            variables=lambda p: {"OLLAMA_API_BASE": p.url},
        ),
        Adapter(
            name="gemini",
            type="gemini",
            protocol="gemini",
            releases=_BOTH,
            errors="exception",
            model_name="gemini-2.5-flash",
            variables=lambda p: {**_GOOGLE_UNSET, "GOOGLE_API_KEY": "loopback", "GOOGLE_GEMINI_BASE_URL": p.url},
        ),
        Adapter(
            # Vertex AI express mode (an API key, no project): google-genai drops the project, the location and
            # every credential when a custom base URL meets a project and location from the environment (its
            # API-gateway mode, posting every call to the bare base URL), so the service-account path cannot
            # be driven; the body is built by the same Vertex code either way. google-adk does not pass
            # ``vertexai`` to the client, so the client reads the Gemini base URL variable, not the Vertex one.
            name="gemini_vertex_ai",
            type="gemini_vertex_ai",
            protocol="gemini_vertex",
            releases=_BOTH,
            errors="exception",
            model_name="gemini-2.5-flash",
            variables=lambda p: {
                **_GOOGLE_UNSET,
                "GOOGLE_GENAI_USE_VERTEXAI": "true",
                "GOOGLE_API_KEY": "loopback",
                "GOOGLE_GEMINI_BASE_URL": p.url,
            },
        ),
        Adapter(
            name="gemini_anthropic",
            type="gemini_anthropic",
            protocol="anthropic_vertex",
            releases=_BOTH,
            errors="exception",
            model_name="claude-sonnet-4-6@default",
            variables=lambda p: {
                **_GOOGLE_UNSET,
                "GOOGLE_CLOUD_PROJECT": "loopback-project",
                "GOOGLE_CLOUD_LOCATION": "us-east5",
                "GOOGLE_APPLICATION_CREDENTIALS": p.service_account_file(),
                "ANTHROPIC_VERTEX_BASE_URL": f"{p.url}/v1",
                "ANTHROPIC_VERTEX_PROJECT_ID": None,
                "CLOUD_ML_REGION": None,
            },
        ),
        Adapter(
            name="bedrock",
            type="bedrock",
            protocol="bedrock",
            releases=_BOTH,
            errors="response",
            model_name="anthropic.claude-3-5-haiku-20241022-v1:0",
            variables=lambda p: {
                "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": p.url,
                "AWS_ENDPOINT_URL": None,
                "AWS_ACCESS_KEY_ID": "AKIALOOPBACK",
                "AWS_SECRET_ACCESS_KEY": "loopback",
                "AWS_SESSION_TOKEN": None,
                "AWS_PROFILE": None,
                "AWS_REGION": "us-east-1",
                "AWS_DEFAULT_REGION": "us-east-1",
                # botocore retries throttling and 5xx with backoff; one failure is one request here
                "AWS_MAX_ATTEMPTS": "1",
                "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "AWS_EC2_METADATA_DISABLED": "true",
            },
        ),
        Adapter(
            name="sap_ai_core",
            type="sap_ai_core",
            protocol="sap_ai_core",
            releases=_BOTH,
            errors="response",
            model_name="gpt-4o",
            settings=lambda p: {
                "base_url": f"{p.url}/sap",
                "auth_url": f"{p.url}/sap-auth",
                "resource_group": "default",
            },
            variables=lambda p: {"SAP_AI_CORE_CLIENT_ID": "loopback", "SAP_AI_CORE_CLIENT_SECRET": "loopback"},
        ),
    )
}
"""Every adapter this module drives, by name (``ADAPTERS[name].available`` for the running release)."""


def available() -> list[Adapter]:
    """The adapters the running kagent-adk release has."""
    return [adapter for adapter in ADAPTERS.values() if adapter.available]

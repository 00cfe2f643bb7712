"""The installed kagent-adk is a supported release, and the facts ``adk.upstream`` records about it hold.

Upstream's own classes are reached through the governed subclasses' bases and its sources, since runtime
patching (in other tests of this process) replaces the module attributes.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import tomllib
from pathlib import Path

import pytest
from google.adk.tools.base_tool import BaseTool
from packaging.requirements import Requirement

from kagent_memory_governed.adk import upstream


def test_the_installed_kagent_adk_is_a_supported_release_and_the_one_asked_for() -> None:
    release = upstream.installed()
    assert release.version == os.environ.get("KAGENT_ADK_VERSION", release.version)


def test_the_dependency_pin_admits_the_locked_releases_and_no_1_0() -> None:
    """kagent-adk 1.0 has no lock and no CI run here (it cannot be installed): the pin keeps it out, and
    ``installed()`` refuses any release between the locked ones at activation."""
    root = Path(__file__).resolve().parents[2]
    dependencies = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    [pin] = [Requirement(d).specifier for d in dependencies if Requirement(d).name == "kagent-adk"]
    assert all(pin.contains(release.version) for release in upstream.SUPPORTED)
    assert not pin.contains("1.0.0a17", prereleases=True) and not pin.contains("1.0.0")
    locks = sorted(path.name for path in (root / "locks").glob("kagent-adk-*.txt"))
    assert locks == sorted(f"kagent-adk-{release.version}.txt" for release in upstream.SUPPORTED)


def test_the_installed_google_adk_and_a2a_sdk_are_the_releases_lock() -> None:
    from importlib.metadata import version

    release = upstream.installed()
    assert (version("google-adk"), version("a2a-sdk")) == (release.google_adk, release.a2a_sdk)
    assert int(release.a2a_sdk.split(".")[0]) < 1  # kagent 0.9 and 0.10 import a2a.server.apps (a2a-sdk 0.3)


@pytest.mark.parametrize(("module", "name"), upstream.RUNTIME_PATCH_TARGETS)
def test_every_name_runtime_patching_replaces_exists(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name)


def test_configure_memory_is_a_method_runtime_patching_can_replace() -> None:
    spec = importlib.util.find_spec("kagent.adk.types")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).read_text()
    assert "    def _configure_memory(self, agent: Agent) -> None:" in source


def test_upstream_save_tool_calls_add_memory_in_the_recorded_form() -> None:
    from kagent_memory_governed.adk.tools import GovernedSaveMemoryTool

    (save_memory_tool,) = GovernedSaveMemoryTool.__bases__  # upstream's SaveMemoryTool
    assert issubclass(save_memory_tool, BaseTool)
    source = inspect.getsource(save_memory_tool.run_async)
    assert f"{upstream.installed().save_tool_call}=" in source


def test_whether_upstream_add_memory_lets_errors_reach_the_tool_is_recorded() -> None:
    from kagent.adk._memory_service import KagentMemoryService

    catches = "except Exception" in inspect.getsource(KagentMemoryService.add_memory)
    assert catches is not upstream.installed().add_memory_raises


def test_the_governed_save_tool_never_runs_upstreams_answer() -> None:
    from kagent_memory_governed.adk.tools import GovernedSaveMemoryTool

    (save_memory_tool,) = GovernedSaveMemoryTool.__bases__
    assert issubclass(save_memory_tool, BaseTool)
    assert save_memory_tool.__module__ == "kagent.adk.tools.memory_tools"
    assert GovernedSaveMemoryTool.run_async is not save_memory_tool.run_async
    assert "Error saving memory" not in inspect.getsource(GovernedSaveMemoryTool)

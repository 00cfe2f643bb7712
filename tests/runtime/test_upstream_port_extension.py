"""What entry-point mode puts in place of ``GovernedRunner`` (patch 0001 has no Runner hook): the extension answers
the series' hooks, and its plugins keep a failure inside memory work without its text."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any

import pytest

from kagent_memory_governed import redaction
from kagent_memory_governed.adk import integration
from kagent_memory_governed.adk.boundary import PLUGIN_NAME, RecallBoundary
from kagent_memory_governed.adk.runtime import extension

SENTINEL = "SENTINEL-TOOL-ERROR-quoting-a-fact"
# No tool and no tool context: the plugin reads neither, only the error and whether memory work is under way.
NOT_READ: Any = None


async def test_a_tool_failing_inside_memory_work_answers_its_type_only() -> None:
    plugin = integration.MemoryWorkToolErrors()
    token = redaction.enter(True)
    try:
        answer = await plugin.on_tool_error_callback(
            tool=NOT_READ, tool_args={}, tool_context=NOT_READ, error=RuntimeError(SENTINEL)
        )
    finally:
        redaction.leave(token)
    assert answer == {"error": "RuntimeError during memory-enabled work (detail withheld)"}


async def test_a_tool_failing_outside_memory_work_is_left_to_kagent() -> None:
    plugin = integration.MemoryWorkToolErrors()
    token = redaction.enter(False)
    try:
        answer = await plugin.on_tool_error_callback(
            tool=NOT_READ, tool_args={}, tool_context=NOT_READ, error=RuntimeError(SENTINEL)
        )
    finally:
        redaction.leave(token)
    assert answer is None


def test_the_extensions_plugins_put_the_recall_boundary_first() -> None:
    plugins = extension.plugins(context=None)
    assert isinstance(plugins[0], RecallBoundary) and plugins[0].name == PLUGIN_NAME
    assert [type(plugin) for plugin in plugins] == [RecallBoundary, integration.MemoryWorkToolErrors]


@pytest.mark.skipif(
    importlib.util.find_spec("kagent.adk.extensions") is None,
    reason="runtime-patching mode: kagent-adk without patch 0001 has no RuntimeExtension to satisfy",
)
def test_the_extension_satisfies_the_series_protocol_and_its_load_time_check() -> None:
    # only kagent-adk with patch 0001 has the module, and neither locked release does: reached by name, its
    # attributes are Any to the type checker on either release
    extensions = importlib.import_module("kagent.adk.extensions")

    assert isinstance(extension, extensions.RuntimeExtension) and not isinstance(extension, type)
    for hook, arguments in extensions._HOOKS.items():  # what kagent-adk checks when it loads the extension
        inspect.signature(getattr(extension, hook)).bind(*[None] * arguments)

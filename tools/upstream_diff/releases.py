"""The kagent-adk releases a series is for, the base a run is for, and the interpreter that runs it.

The supported releases are read from the package's source, never imported: ``./dev`` asks for them
(``./upstream-diff releases``) with the system's Python before any virtualenv exists, so this module and what it
imports are the standard library only.
"""

from __future__ import annotations

import ast
import functools
import os
import sys
from pathlib import Path

from upstream_diff.shell import run

ROOT = Path(__file__).resolve().parents[2]  # the repository
PRIMARY = "1.0.0a17"  # the newest upstream source there is: the primary series' base
PACKAGE = Path("python/packages/kagent-adk")  # kagent-adk's place in the upstream repository
SOURCE = PACKAGE / "src"
TESTS = PACKAGE / "tests/unittests"
# What kagent.adk needs in its environment to be imported (its settings are read at import).
ENVIRONMENT = {"KAGENT_URL": "http://controller.invalid", "KAGENT_NAMESPACE": "kagent", "KAGENT_NAME": "helper"}


def _supported() -> tuple[str, ...]:
    """The supported releases, oldest first, as the package lists them (``adk/upstream.py``'s ``SUPPORTED``: one
    list, which ./dev reads through ``./upstream-diff releases``); read from the source, so no import is needed."""
    tree = ast.parse((ROOT / "kagent_memory_governed/adk/upstream.py").read_text())
    [listed] = [
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "SUPPORTED"
    ]
    assert isinstance(listed, ast.Tuple)
    return tuple(ast.literal_eval(release.args[0]) for release in listed.elts if isinstance(release, ast.Call))


SUPPORTED = _supported()  # the releases a lock and CI cover: their series' tests run here
NEWEST = SUPPORTED[-1]  # the default base, as in ./dev


@functools.cache
def base() -> str:
    """The kagent-adk release the series is for: --base, else $KAGENT_ADK_VERSION, else the kagent-adk installed
    in the project's virtualenv."""
    return os.environ.get("KAGENT_ADK_VERSION") or installed(python())


def installed(interpreter: str) -> str:
    code = "from importlib.metadata import version; print(version('kagent-adk'))"
    return run(interpreter, "-c", code, quiet=True).strip()


def python() -> str:
    """The base's virtualenv's interpreter (.venv-<base>, or $KAGENT_GOVERNED_MEMORY_VENV), else this one."""
    version = os.environ.get("KAGENT_ADK_VERSION", NEWEST)
    default = f".venv-{version if version in SUPPORTED else NEWEST}"
    venv = ROOT / os.environ.get("KAGENT_GOVERNED_MEMORY_VENV", default) / "bin/python"
    return str(venv) if venv.exists() else sys.executable


def tool(name: str) -> str:
    """A command installed beside ``python()`` (ruff)."""
    return str(Path(python()).parent / name)

"""Names a package imports on first use (PEP 562), so that importing it loads only what is asked for.

``names(package, {module: "Name Other"}, namespace)`` returns the package's ``__getattr__``: the first lookup of a
listed name imports ``package.module`` and keeps the value in ``namespace`` (the package's ``globals()``), so later
lookups do not come back; any other name is an ``AttributeError``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def names(package: str, listed: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    where = {name: module for module, spaced in listed.items() for name in spaced.split()}

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
            namespace[name] = value  # found once: later lookups do not come back here
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__

"""The cluster examples as ``kubectl kustomize`` renders them (deploy/), for the tests that read them."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no hints, and types-PyYAML is not a dependency

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


@functools.cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    """What ``kubectl kustomize deploy/overlays/<overlay>`` renders."""
    return render(DEPLOY / "overlays" / overlay)


def render(directory: Path) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with kustomize) is needed to render deploy/overlays"
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)

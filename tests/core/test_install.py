"""The install line works on a fresh machine: the documents give one, ``./dev example`` (run by CI for every
release) runs exactly it in a fresh virtualenv, and the bounds the package declares hold every lock."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from kagent_memory_governed.adk import upstream

ROOT = Path(__file__).resolve().parents[2]
NEWEST = upstream.SUPPORTED[-1].version
LOCKS = {release.version: ROOT / "locks" / f"kagent-adk-{release.version}.txt" for release in upstream.SUPPORTED}
TESTING_EXTRAS = "'.[testing]' pytest pytest-asyncio"


def install_lines(document: str) -> list[str]:
    """The ``pip install`` lines (pip's or uv's) of a document's shell blocks."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / document).read_text(), re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if "pip install" in line]


PIP = f".venv/bin/python -m pip install -c locks/kagent-adk-{NEWEST}.txt"
UV = f"uv pip install --python .venv/bin/python -c locks/kagent-adk-{NEWEST}.txt"


def test_the_readme_installs_from_the_checkout_with_the_newest_lock_into_a_fresh_virtualenv() -> None:
    assert install_lines("README.md") == [f"{PIP} .", f"{UV} ."]
    readme = (ROOT / "README.md").read_text()
    assert "python3 -m venv .venv" in readme and "uv venv .venv" in readme


def test_docs_testing_installs_the_testing_extra_the_same_way() -> None:
    assert install_lines("docs/testing.md") == [f"{PIP} {TESTING_EXTRAS}", f"{UV} {TESTING_EXTRAS}"]


def test_dev_example_runs_the_documented_lines_in_fresh_virtualenvs() -> None:
    """The uv line for every release, the pip line for the newest (./dev's example step, run by ./dev test)."""
    dev = (ROOT / "dev").read_text()
    step = re.sub(r"\s*\\\n\s*", " ", dev[dev.index("pip_install() {") : dev.index("suite() {")])
    lock = '-c "locks/kagent-adk-$1.txt"'
    pip, uv = install_lines("docs/testing.md")
    pip = pip.replace(f"-c locks/kagent-adk-{NEWEST}.txt", lock).replace(".venv/bin/python", '"$2/pip/bin/python"')
    uv = uv.replace(f"-c locks/kagent-adk-{NEWEST}.txt", lock).replace(".venv/bin/python", '"$scratch/venv/bin/python"')
    assert pip.replace("pip install ", "pip install --quiet --disable-pip-version-check ") in step
    assert uv.replace("uv pip install ", "uv pip install --quiet ") in step
    assert '-m venv "$2/pip"' in step and 'uv venv --quiet --python "${PYTHON:-python3}" "$scratch/venv"' in step
    assert 'if [ "$1" = "${supported[-1]}" ]' in step  # pip for the newest release
    assert '[ -x "$scratch/pip/bin/pytest" ] || pip_install "$1" "$scratch"' in step  # unless ./dev test made it
    assert 'example "$version"' in dev[dev.index("matrix() {") :]  # CI's ./dev test runs it for every release


def pins(lock: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            found[canonicalize_name(name)] = version
    return found


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    return [Requirement(r) for r in requirements if not r.startswith("kagent-memory-governed")]


@pytest.mark.parametrize("release", LOCKS)
def test_every_lock_pins_every_declared_dependency_within_its_bounds(release: str) -> None:
    pinned = pins(LOCKS[release])
    for requirement in declared():
        version = pinned.get(canonicalize_name(requirement.name))
        assert version is not None, (release, requirement.name)
        assert requirement.specifier.contains(version, prereleases=True), (release, str(requirement), version)


def test_the_zero_x_lines_stay_below_a2a_sdk_1_and_google_adk_2() -> None:
    bounds: dict[str, SpecifierSet] = {canonicalize_name(r.name): r.specifier for r in declared()}
    assert not bounds["a2a-sdk"].contains("1.0.0") and bounds["a2a-sdk"].contains("0.3.26")
    assert not bounds["google-adk"].contains("2.0.0")
    assert not bounds["kagent-adk"].contains("0.11.0")

"""Pristine sources: a kagent-adk release's own files (its wheel's RECORD) under the upstream repository's path.

The supported releases' come from the virtualenv, 1.0.0a17's from the registry (pip download --no-deps), checked
against the sha256 recorded here. Nothing downloaded is kept.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from upstream_diff.releases import ENVIRONMENT, PRIMARY, SOURCE, python
from upstream_diff.shell import git, run, scratch


@dataclass(frozen=True)
class Wheel:
    distribution: str
    version: str
    sha256: str


# What the 1.0.0a17 sources are read from: kagent-adk's wheel, and for the names the package uses from other
# distributions, the lowest release kagent-adk 1.0.0a17 admits (its Requires-Dist).
PRIMARY_WHEELS = (
    Wheel("kagent-adk", "1.0.0a17", "55f6a0a23c54e17eba5f0c01b512e70976795569b46f77b42b198cfd0a042a09"),
    Wheel("kagent-core", "1.0.0a17", "079505eb47d68aa6e1c985dc25e68870a432d6632be425a90de82dc7ce8235f1"),
    Wheel("google-adk", "2.12.0", "79f89ea94ccd87e4ac8c893e81c44ed2ce5568d05406a95c1d10bcef0ce0ff5d"),
    Wheel("google-genai", "2.29.0", "7adda55cb6746fb46d38ad3202c3372840b96eede964b5fb3df1469cd4998570"),
    Wheel("a2a-sdk", "1.1.5", "c1d63d36b79a097c62dd9be001fce21d5939f5a811a9c5afd0ba8082f13f68bf"),
)


@functools.cache
def wheel(dependency: Wheel) -> Path:
    """The wheel, downloaded from the registry once per run and checked against its recorded sha256."""
    target = scratch("upstream-wheel-")
    requirement = f"{dependency.distribution}=={dependency.version}"
    run(python(), "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
        "-d", str(target), requirement, quiet=True)  # fmt: skip
    [found] = target.glob("*.whl")
    digest = hashlib.sha256(found.read_bytes()).hexdigest()
    if digest != dependency.sha256:
        raise SystemExit(f"upstream-diff: {found.name} has sha256 {digest}, recorded {dependency.sha256}")
    return found


@functools.cache
def primary_site() -> Path:
    """The 1.0.0a17 wheels' files extracted into one directory, as they would be installed."""
    site = scratch("upstream-site-")
    for dependency in PRIMARY_WHEELS:
        with zipfile.ZipFile(wheel(dependency)) as archive:
            archive.extractall(site)
    return site


def installed_site() -> Path:
    """The site-packages directory of the base's virtualenv."""
    code = "import kagent.adk, pathlib; print(pathlib.Path(kagent.adk.__file__).parents[2])"
    return Path(run(python(), "-c", code, quiet=True, env=ENVIRONMENT).strip())


def pristine(tree: Path, version: str) -> None:
    """The exact files of kagent-adk ``version``'s wheel (its RECORD), under the repository's path, committed as
    the root of a new git repository in ``tree``."""
    if version == PRIMARY:
        with zipfile.ZipFile(wheel(PRIMARY_WHEELS[0])) as archive:
            for name in archive.namelist():
                if name.startswith("kagent/adk/") and "__pycache__" not in name:
                    target = tree / SOURCE / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(name))
        origin = "the registry's wheel"
    else:
        listing = run(
            python(),
            "-c",
            "from importlib.metadata import distribution as d\n"
            f"dist = d('kagent-adk'); assert dist.version == '{version}', dist.version\n"
            "for f in dist.files:\n"
            "    if f.parts[:2] == ('kagent', 'adk') and '__pycache__' not in f.parts: print(f.locate())",
            quiet=True,
        )
        for located in listing.split():
            source = Path(located)
            relative = source.parts[source.parts.index("kagent") :]
            target = tree / SOURCE / Path(*relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        origin = "the pinned wheel"
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", f"kagent-adk {version}: pristine sources from {origin}")

"""Ruff on a patched tree with upstream's configuration: a series may add no violation and no unformatted code."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from upstream_diff.releases import PACKAGE, SUPPORTED, tool
from upstream_diff.shell import git, run, say

# Upstream's ruff configuration (python/pyproject.toml, which the package's configuration extends): target py310
# at v0.9.11 and v0.10.4, py311 on main (5229184e) and in 1.0 (Requires-Python >=3.11).
UPSTREAM_RUFF = """line-length = 120
target-version = "{target}"

[format]
docstring-code-format = true

[lint]
select = ["E", "F", "W", "B", "Q", "I", "ASYNC", "T20"]
ignore = ["F401", "E501", "B008", "ASYNC109"]
"""


def changed_python(tree: Path) -> list[str]:
    """The Python files the series adds or modifies, relative to the tree."""
    root = git(tree, "rev-list", "--max-parents=0", "HEAD").strip()
    names = git(tree, "diff", "--name-only", "--diff-filter=AM", root, "HEAD").split()
    return [name for name in names if name.endswith(".py")]


def violations(package: Path, files: list[str], target: str) -> Counter[tuple[str, str]]:
    (package / "ruff.toml").write_text(UPSTREAM_RUFF.format(target=target))  # as upstream's configuration extends
    present = [name for name in files if (package / name).exists()]
    found = run(
        tool("ruff"), "check", "--no-fix", "--exit-zero", "--output-format=json", *present, cwd=package, quiet=True
    )
    return Counter((str(Path(v["filename"]).relative_to(package)), v["code"]) for v in json.loads(found or "[]"))


def lint(tree: Path, changed: list[str], version: str) -> None:
    """Fail on any ruff violation the series adds (upstream has a few of its own) and on unformatted code."""
    target = "py310" if version in SUPPORTED else "py311"
    files = [str(Path(name).relative_to(PACKAGE)) for name in changed]
    root = git(tree, "rev-list", "--max-parents=0", "HEAD").strip()
    with tempfile.TemporaryDirectory(prefix="upstream-base-") as pristine:
        for name in changed:
            original = subprocess.run(["git", "show", f"{root}:{name}"], cwd=tree, capture_output=True, check=False)
            if original.returncode == 0:
                copy = Path(pristine) / Path(name).relative_to(PACKAGE)
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(original.stdout)
        before = violations(Path(pristine), files, target)
    after = violations(tree / PACKAGE, files, target)
    added = after - before
    if added:
        run(tool("ruff"), "check", "--no-fix", *files, cwd=tree / PACKAGE)  # shows them, then fails
        raise SystemExit(f"upstream-diff: the series adds ruff violations: {dict(added)}")
    say(f"no new violations ({sum(before.values())} in the pristine files, unchanged; target {target})")
    run(tool("ruff"), "format", "--check", *files, cwd=tree / PACKAGE)

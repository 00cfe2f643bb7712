"""A series' mails: ``patches/v<base>/series`` lists them in order; each is a ``git format-patch`` mail.

What is read from a mail: the patches it states it needs (``Depends-on: NNNN``), its author and sign-off (the one
placeholder identity, always), and for each file its ``index`` line's blobs and its first hunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from upstream_diff.releases import ROOT

SERIES = ROOT / "patches"
SIGNOFF = "kagent-memory-governed <maintainers@kagent-memory-governed.invalid>"  # the one placeholder identity


def patches(version: str) -> Path:
    return SERIES / f"v{version}"


def read_series(version: str) -> list[Path]:
    """The mails of kagent-adk ``version``'s series, in order; refused when the listing or a mail it names is
    missing."""
    listing = patches(version) / "series"
    if not listing.exists():
        raise SystemExit(f"upstream-diff: no series for kagent-adk {version} ({listing.relative_to(ROOT)} is missing)")
    names = [line.strip() for line in listing.read_text().splitlines()]
    mails = [patches(version) / name for name in names if name and not name.startswith("#")]
    missing = [p.name for p in mails if not p.exists()]
    if missing:
        raise SystemExit(f"upstream-diff: series names missing patches: {', '.join(missing)}")
    return mails


def depends_on(patch: Path, mails: list[Path]) -> list[Path]:
    """The patches ``patch`` states it needs (``Depends-on: 0001`` lines in its message), in series order."""
    numbers = re.findall(r"^Depends-on: (\d{4})\b", patch.read_text().split("\n---\n", 1)[0], re.MULTILINE)
    return [mail for mail in mails if mail.name[:4] in numbers]


def check_signoff(mails: list[Path]) -> None:
    """Every patch in patches/ is from, and signed off by, the one placeholder identity: no person's sign-off is
    kept here. Whoever submits re-signs the series and exports it (``export``), which refuses the placeholder."""
    for mail in mails:
        header = mail.read_text().split("\n---\n", 1)[0]
        authors = re.findall(r"^From: (.+)$", header, re.MULTILINE)
        signoffs = re.findall(r"^Signed-off-by: (.+)$", header, re.MULTILINE)
        if authors != [SIGNOFF] or signoffs != [SIGNOFF]:
            raise SystemExit(f"upstream-diff: {mail.name}: From and Signed-off-by must both be {SIGNOFF}")


@dataclass(frozen=True)
class FileDiff:
    """One file of a mail: its path, the blobs its ``index`` line names, and its first hunk's lines."""

    path: str
    old: str  # abbreviated blob ids; all zeros for a file the patch creates (old) or deletes (new)
    new: str
    hunk_start: int  # the first hunk's first line in the old file (0: none)
    hunk: tuple[str, ...]


def file_diffs(mail: Path) -> list[FileDiff]:
    """Each file the mail changes; refused when one lacks an index line (a series not cut by regenerate)."""
    found: list[FileDiff] = []
    for block in re.split(r"^(?=diff --git )", mail.read_text(), flags=re.MULTILINE)[1:]:
        path = re.match(r"diff --git a/(\S+) b/", block)
        index = re.search(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)", block, re.MULTILINE)
        if path is None or index is None:
            raise SystemExit(f"upstream-diff: {mail.name}: a file without an index line (regenerate the series)")
        hunk = re.search(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*\n((?:[ +\-\\].*\n?)*)", block, re.MULTILINE)
        lines = tuple(hunk.group(2).splitlines()) if hunk else ()
        found.append(FileDiff(path.group(1), index.group(1), index.group(2), int(hunk.group(1)) if hunk else 0, lines))
    return found

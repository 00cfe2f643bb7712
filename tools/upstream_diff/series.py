"""Cut, check and export a series.

Each PR must stand alone on upstream main. ``cut`` makes every commit of a working tree a mail cut from the
pristine base alone, so its ``index`` lines name the base's blobs; ``check_alone`` and ``check_moved`` prove each
mail applies alone, names the pristine pre-image and the post-image it makes, and merges with ``git am -3`` onto a
base that moved on; ``export_series`` cuts the same way for submission, once a person has re-signed every commit.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from upstream_diff.mails import SERIES, SIGNOFF, FileDiff, depends_on, file_diffs, read_series
from upstream_diff.shell import IDENTITY, git, say, scratch


def blob(tree: Path, path: str) -> str | None:
    """The blob id of ``path`` in the working tree, or None when it does not exist."""
    return git(tree, "hash-object", path).strip() if (tree / path).is_file() else None


def matches(expected: str | None, abbreviated: str) -> bool:
    return abbreviated.strip("0") == "" if expected is None else expected.startswith(abbreviated)


def check_alone(tree: Path, mails: list[Path], label: str) -> None:
    """Each patch applies to the pristine base (the root commit of ``tree``) on its own, or after the patches it
    states it needs; its index lines name that base's blobs (the pre-image) and what applying it makes (the
    post-image), so a maintainer's ``git am -3`` can fall back on them."""
    for mail in mails:
        needed = depends_on(mail, mails)
        for prerequisite in needed:
            git(tree, "apply", prerequisite.as_posix())
        try:
            diffs = file_diffs(mail)
            stale = [d.path for d in diffs if not matches(blob(tree, d.path), d.old)]
            if stale:
                raise SystemExit(
                    f"upstream-diff: {mail.name}: its index lines do not name the pristine {label} blobs of "
                    f"{', '.join(stale)} (cut from another patch's result? ./upstream-diff regenerate cuts each "
                    "patch from the pristine base)"
                )
            result = subprocess.run(
                ["git", "apply", "--whitespace=error-all", mail.as_posix()], cwd=tree, capture_output=True
            )
            if result.returncode != 0:
                sys.stderr.write(result.stderr.decode())
                raise SystemExit(f"upstream-diff: {mail.name} does not apply alone to {label}")
            made = [d.path for d in diffs if not matches(blob(tree, d.path), d.new)]
            if made:
                raise SystemExit(f"upstream-diff: {mail.name}: applied alone, it does not make the post-image "
                                 f"its index lines name for {', '.join(made)}")  # fmt: skip
        finally:
            git(tree, "reset", "-q", "--hard")
            git(tree, "clean", "-q", "-fd")
        after = f" after {', '.join(p.name[:4] for p in needed)}" if needed else ""
        say(f"{mail.name[:4]} applies alone to pristine {label}{after}; its index lines name the pristine blobs")


def moved(tree: Path, diffs: list[FileDiff]) -> int:
    """Edit one context line of each modified file's first hunk, two lines or more from any change, as a branch
    that moved on would: a plain apply then fails on that hunk and ``git am -3`` must merge through the blobs the
    index lines name. Returns how many files were moved."""
    count = 0
    for diff in diffs:
        if diff.old.strip("0") == "" or not (tree / diff.path).is_file():
            continue
        lines, old_line = diff.hunk, diff.hunk_start
        for position, line in enumerate(lines):
            quiet_before = position == 0 or lines[position - 1].startswith(" ")
            quiet_after = position + 1 < len(lines) and lines[position + 1].startswith(" ")
            if line.startswith(" ") and quiet_before and quiet_after:
                text = (tree / diff.path).read_text().split("\n")
                text[old_line - 1] += "  (moved upstream)"
                (tree / diff.path).write_text("\n".join(text))
                count += 1
                break
            if not line.startswith("+"):
                old_line += 1
    return count


def check_moved(tree: Path, mails: list[Path], label: str) -> None:
    """Each patch alone (after the patches it states it needs) with ``git am -3`` onto a branch of the pristine
    base that changed a line of its context, as a maintainer applies a PR to a main that moved on: in a fresh
    clone of the base holding no other patch's blobs, so only the blobs its index lines name can merge it."""
    for mail in mails:
        work = scratch("upstream-moved-")
        git(work, "clone", "-q", "--no-local", tree.as_uri(), ".")  # the base's reachable objects only
        for prerequisite in depends_on(mail, mails):
            git(work, "am", "-q", prerequisite.as_posix())
        if moved(work, file_diffs(mail)):
            git(work, "commit", "-q", "-a", "-m", "upstream moved on")
        result = subprocess.run(
            ["git", *IDENTITY, "am", "-q", "-3", "--whitespace=error-all", mail.as_posix()],
            cwd=work,
            capture_output=True,
        )
        shutil.rmtree(work, ignore_errors=True)
        if result.returncode != 0:
            sys.stderr.write(result.stdout.decode() + result.stderr.decode())
            raise SystemExit(f"upstream-diff: {mail.name}: git am -3 fails on a moved {label}")
        say(f"{mail.name[:4]} applies alone with git am -3 to a moved {label}")


def apply_series(tree: Path, version: str, *, stat: bool = True) -> None:
    """The series of kagent-adk ``version`` as commits on ``tree``, strictly: any reject or fuzz fails."""
    for patch in read_series(version):
        git(tree, "am", "-q", "--whitespace=error-all", str(patch))
        if stat:
            say(git(tree, "show", "--stat", "--format=%n== %s", "HEAD").rstrip())


def cut(tree: Path, target: Path) -> list[str]:
    """The commits of ``tree`` above its root (the pristine base), each cut from the root alone (after the commits
    its ``Depends-on:`` lines name), as numbered mails in ``target``: their index lines name pristine blobs. A
    commit that does not apply to the root alone stops it."""
    root = git(tree, "rev-list", "--max-parents=0", "HEAD").strip()
    commits = git(tree, "rev-list", "--reverse", f"{root}..HEAD").split()
    work = scratch("upstream-cut-")
    git(work, "clone", "-q", str(tree), ".")
    target.mkdir(parents=True, exist_ok=True)
    names = []
    for number, commit in enumerate(commits, start=1):
        message = git(work, "log", "-1", "--format=%B", commit)
        needed = [int(n) for n in re.findall(r"^Depends-on: (\d{4})\b", message, re.MULTILINE)]
        git(work, "checkout", "-q", "--detach", root)
        for picked in [*(commits[n - 1] for n in needed if 0 < n < number), commit]:
            result = subprocess.run(
                ["git", *IDENTITY, "cherry-pick", "--allow-empty", picked], cwd=work, capture_output=True
            )
            if result.returncode != 0:
                raise SystemExit(
                    f"upstream-diff: commit {number:04d} ({commit[:12]}) does not apply to the pristine base alone: "
                    "move the change, or name the patch it needs in a Depends-on: line"
                )
        git(work, "format-patch", "-q", "-n", "--no-signature", "--zero-commit", f"--start-number={number}",
            "-o", str(target), "-1", "HEAD")  # fmt: skip
        [mail] = target.glob(f"{number:04d}-*.patch")
        text = re.sub(r"^Subject: \[PATCH \d+/\d+\]", f"Subject: [PATCH {number}/{len(commits)}]",
                      mail.read_text(), count=1, flags=re.MULTILINE)  # fmt: skip
        mail.write_text(text)
        names.append(mail.name)
    return names


def placeholder_commits(tree: Path) -> list[str]:
    """The commits above ``tree``'s root that a person has not re-signed: authored or signed off by the placeholder,
    or without a ``Signed-off-by:`` of their author."""
    root = git(tree, "rev-list", "--max-parents=0", "HEAD").strip()
    unsigned = []
    for commit in git(tree, "rev-list", "--reverse", f"{root}..HEAD").split():
        author = git(tree, "log", "-1", "--format=%an <%ae>", commit).strip()
        trailers = git(tree, "log", "-1", "--format=%(trailers:key=Signed-off-by,valueonly)", commit).split("\n")
        signoffs = [line.strip() for line in trailers if line.strip()]
        if author == SIGNOFF or SIGNOFF in signoffs or author not in signoffs:
            subject = git(tree, "log", "-1", "--format=%s", commit).strip()
            unsigned.append(f"{commit[:12]} {subject} (author {author}; signed off by {', '.join(signoffs) or 'none'})")
    return unsigned


def export_series(tree: Path, target: Path, checked: list[Path]) -> list[str]:
    """``tree``'s commits cut from the pristine base into ``target``, for submission: only once every commit is
    re-signed by a person (no placeholder), and only if their changes are those of the checked series."""
    unsigned = placeholder_commits(tree)
    if unsigned:
        raise SystemExit(
            f"upstream-diff: refusing to export a series that still carries the placeholder sign-off ({SIGNOFF}) "
            "or a commit without its author's Signed-off-by; whoever submits re-signs it first "
            "(CONTRIBUTING.md, 'Signing off'):\n  " + "\n  ".join(unsigned)
        )
    if target.resolve() == SERIES or SERIES in target.resolve().parents:
        raise SystemExit("upstream-diff: export outside patches/: the repository keeps the placeholder only")
    if target.exists() and any(target.iterdir()):
        raise SystemExit("upstream-diff: the export directory must be empty or new")
    names = cut(tree, target)
    changes = [(target / name).read_text().partition("\ndiff --git ")[2] for name in names]
    if changes != [mail.read_text().partition("\ndiff --git ")[2] for mail in checked]:
        shutil.rmtree(target)
        raise SystemExit("upstream-diff: the tree's changes are not the checked series': regenerate and check first")
    return names

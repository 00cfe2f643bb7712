"""How ``./upstream-diff`` cuts, checks and exports a series, on small git trees of its own (no kagent-adk).

Each PR must stand alone on upstream main: ``regenerate`` cuts every commit from the pristine base alone, so its
``index`` lines name the base's blobs and a maintainer's ``git am -3`` can merge through them; ``check`` fails on a
patch whose pre-image is not the pristine base's (cut from another patch's result, as plain ``format-patch`` of a
series does) or which does not make the post-image it names. Patches here carry one placeholder sign-off; ``export``
refuses a series until a person has re-signed every commit.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from upstream_diff.mails import file_diffs
from upstream_diff.series import check_alone, check_moved, cut, export_series

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "python/packages/kagent-adk/src/kagent/adk/types.py"
PLACEHOLDER = ("kagent-memory-governed", "maintainers@kagent-memory-governed.invalid")
PERSON = ("Ada Lovelace", "ada@example.org")


def git(tree: Path, *args: str, identity: tuple[str, str] = PLACEHOLDER) -> str:
    name, email = identity
    environment = {
        **os.environ,
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }
    return subprocess.run(["git", *args], cwd=tree, env=environment, capture_output=True, text=True, check=True).stdout


def edit(tree: Path, line: int, text: str) -> None:
    path = tree / SOURCE
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


def commit(tree: Path, subject: str) -> None:
    signoff = f"Signed-off-by: {PLACEHOLDER[0]} <{PLACEHOLDER[1]}>"
    git(tree, "commit", "-q", "-a", "-m", f"{subject}\n\nWhy and how.\n\n{signoff}")


@pytest.fixture
def series(tmp_path: Path) -> Path:
    """A pristine base (one file of 40 lines) and two commits on it, far apart in that one file: as 0001 and 0002
    both touch types.py."""
    tree = tmp_path / "series"
    (tree / SOURCE).parent.mkdir(parents=True)
    (tree / SOURCE).write_text("".join(f"line {n}\n" for n in range(1, 41)))
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "pristine base")
    edit(tree, 5, "line 5, first patch")
    commit(tree, "feat(adk): the first patch")
    edit(tree, 33, "line 33, second patch")
    commit(tree, "fix(adk): the second patch")
    return tree


def pristine_copy(series: Path, tmp_path: Path) -> Path:
    """The series tree's root commit alone in a repository of its own, as ``./upstream-diff check`` lays out the
    pristine base: none of the series' blobs are in it."""
    base = tmp_path / "base"
    (base / SOURCE).parent.mkdir(parents=True)
    root = git(series, "rev-list", "--max-parents=0", "HEAD").strip()
    (base / SOURCE).write_text(git(series, "show", f"{root}:{SOURCE}"))
    git(base, "init", "-q")
    git(base, "add", "-A")
    git(base, "commit", "-q", "-m", "pristine base")
    return base


def chained(series: Path, tmp_path: Path) -> list[Path]:
    """The series as plain ``git format-patch`` writes it: each patch cut from the one before's result."""
    root = git(series, "rev-list", "--max-parents=0", "HEAD").strip()
    target = tmp_path / "chained"
    git(series, "format-patch", "-q", "--zero-commit", "-o", str(target), f"{root}..HEAD")
    return sorted(target.glob("*.patch"))


def test_a_patch_whose_pre_image_is_not_the_pristine_base_fails_the_check(series: Path, tmp_path: Path) -> None:
    mails = chained(series, tmp_path)
    base = pristine_copy(series, tmp_path)
    subprocess.run(["git", "apply", "--check", str(mails[1])], cwd=base, check=True)  # it applies, with an offset
    with pytest.raises(SystemExit, match=r"0002-.*index lines do not name the pristine test base blobs of .*types\.py"):
        check_alone(base, mails, "test base")
    with pytest.raises(SystemExit, match=r"0002-.*git am -3 fails on a moved test base"):
        check_moved(base, mails, "test base")


def test_regenerate_cuts_each_patch_from_the_pristine_base(series: Path, tmp_path: Path) -> None:
    names = cut(series, tmp_path / "cut")
    mails = [tmp_path / "cut" / name for name in names]
    base = pristine_copy(series, tmp_path)
    pristine_blob = git(base, "hash-object", SOURCE).strip()
    assert [diff.old for mail in mails for diff in file_diffs(mail)] == [pristine_blob[:7]] * 2
    assert [name[:5] for name in names] == ["0001-", "0002-"]
    assert "Subject: [PATCH 2/2] fix(adk): the second patch" in mails[1].read_text()
    check_alone(base, mails, "test base")
    check_moved(base, mails, "test base")
    assert git(base, "status", "--porcelain") == "" and git(base, "rev-list", "--count", "HEAD").strip() == "1"


def test_a_hand_edited_patch_fails_on_the_post_image_it_names(series: Path, tmp_path: Path) -> None:
    [first, _] = [tmp_path / "cut" / name for name in cut(series, tmp_path / "cut")]
    first.write_text(first.read_text().replace("+line 5, first patch", "+line 5, edited by hand"))
    with pytest.raises(SystemExit, match="does not make the post-image"):
        check_alone(pristine_copy(series, tmp_path), [first], "test base")


def test_a_commit_that_needs_the_one_before_is_not_cut_alone(series: Path, tmp_path: Path) -> None:
    edit(series, 5, "line 5, first patch, reworked by a third")
    commit(series, "fix(adk): a third patch on the first one's line")
    with pytest.raises(SystemExit, match="commit 0003 .* does not apply to the pristine base alone"):
        cut(series, tmp_path / "cut")


def resign(tree: Path) -> None:
    """What CONTRIBUTING.md asks of whoever submits, with the rebase it gives read from it: their own authorship
    and sign-off on each commit, the placeholder's line dropped."""
    documented = re.search(r"git rebase --signoff \"\$root\" --exec '([^']+)'", (ROOT / "CONTRIBUTING.md").read_text())
    assert documented is not None, "CONTRIBUTING.md no longer gives the re-signing rebase"
    root = git(tree, "rev-list", "--max-parents=0", "HEAD").strip()
    git(tree, "rebase", "-q", "--signoff", root, "--exec", documented.group(1), identity=PERSON)


def test_export_refuses_a_series_that_still_carries_the_placeholder_sign_off(series: Path, tmp_path: Path) -> None:
    checked = [tmp_path / "cut" / name for name in cut(series, tmp_path / "cut")]
    with pytest.raises(SystemExit, match=r"refusing to export .*placeholder sign-off") as refused:
        export_series(series, tmp_path / "outgoing", checked)
    assert "the first patch" in str(refused.value) and "the second patch" in str(refused.value)
    assert not (tmp_path / "outgoing").exists()

    resign(series)
    names = export_series(series, tmp_path / "outgoing", checked)
    exported = [(tmp_path / "outgoing" / name).read_text() for name in names]
    for mail in exported:
        assert "From: Ada Lovelace <ada@example.org>" in mail
        assert "Signed-off-by: Ada Lovelace <ada@example.org>" in mail
        assert PLACEHOLDER[1] not in mail


def test_export_refuses_a_commit_without_its_authors_sign_off(series: Path, tmp_path: Path) -> None:
    checked = [tmp_path / "cut" / name for name in cut(series, tmp_path / "cut")]
    resign(series)
    git(series, "commit", "-q", "--amend", "-m", "fix(adk): the second patch\n\nNo sign-off.", identity=PERSON)
    with pytest.raises(SystemExit, match=r"second patch \(author Ada Lovelace <ada@example.org>; signed off by none"):
        export_series(series, tmp_path / "outgoing", checked)


def test_export_refuses_changes_that_are_not_the_checked_series(series: Path, tmp_path: Path) -> None:
    checked = [tmp_path / "cut" / name for name in cut(series, tmp_path / "cut")]
    resign(series)
    edit(series, 36, "line 36, an unchecked change")
    git(series, "commit", "-q", "-a", "--amend", "--no-edit", identity=PERSON)
    with pytest.raises(SystemExit, match="not the checked series"):
        export_series(series, tmp_path / "outgoing", checked)
    with pytest.raises(SystemExit, match="outside patches/"):
        export_series(series, ROOT / "patches" / "v0.0.0", checked)


# what ``check`` runs beside its checks (the entry-point suite): held until finished, failing as a command does


def test_a_command_beside_prints_its_output_when_finished_and_fails_with_its_status(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from upstream_diff.shell import Beside

    passing = Beside(sys.executable, "-c", "print('its output'); import sys; print('its errors', file=sys.stderr)")
    assert capfd.readouterr().out == ""  # nothing yet: held until finished
    passing.finish()
    assert capfd.readouterr().out.split("\n")[:2] == ["its output", "its errors"]
    failing = Beside(sys.executable, "-c", "import sys; print('why'); sys.exit(3)")
    with pytest.raises(SystemExit, match=r"\(exit 3\)"):
        failing.finish()
    assert "why" in capfd.readouterr().out


def test_a_command_beside_is_stopped_when_the_checks_fail(tmp_path: Path) -> None:
    from upstream_diff.shell import Beside

    marker = tmp_path / "finished"
    code = f"import time, pathlib; time.sleep(60); pathlib.Path({str(marker)!r}).touch()"
    running = Beside(sys.executable, "-c", code)
    running.stop()
    assert running._process.returncode is not None and not marker.exists()

"""The check verb: a supported base's backport series, then the primary series and the port report, with this
package's suite in entry-point mode running beside them against the patched base (a tree of its own); for
1.0.0a17, the primary series and the report.

kagent-adk 1.0 cannot be installed here, so the primary series is applied, linted and compiled but its tests are
not run; the check says so each time.
"""

from __future__ import annotations

import ast
from pathlib import Path

from upstream_diff.lint import changed_python, lint
from upstream_diff.mails import check_signoff, read_series
from upstream_diff.port import port_report
from upstream_diff.pristine import pristine
from upstream_diff.releases import ENVIRONMENT, PACKAGE, PRIMARY, ROOT, SOURCE, SUPPORTED, TESTS, python
from upstream_diff.series import apply_series, check_alone, check_moved
from upstream_diff.shell import Beside, run, say, scratch

NOT_RUNNABLE = (
    "kagent-adk 1.0.0a17 requires kagent-proto>=0.1.0, which the package registry does not serve "
    "(pip install --pre kagent-adk==1.0.0a17: no matching distribution for kagent-proto), so kagent.adk 1.0 "
    "cannot be imported here"
)


def patched_tree(version: str, *, stat: bool) -> Path:
    """A scratch tree: pristine ``version``, each patch checked alone, then the series applied."""
    tree = scratch(f"upstream-diff-{version}-")
    pristine(tree, version)
    mails = read_series(version)
    check_signoff(mails)
    check_alone(tree, mails, f"kagent-adk {version}")
    check_moved(tree, mails, f"kagent-adk {version}")
    apply_series(tree, version, stat=stat)
    return tree


def count_tests(tree: Path) -> tuple[int, int]:
    """(test functions, test files) the series adds or changes under the package's tests."""
    files = [name for name in changed_python(tree) if name.startswith(str(TESTS))]
    functions = 0
    for name in files:
        for node in ast.walk(ast.parse((tree / name).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                functions += 1
    return functions, len(files)


def check_primary() -> Path:
    """The 1.0.0a17 series: alone, applied, linted, compiled; its tests cannot run here, and the output says so."""
    say(f"\n==== the primary series: patches/v{PRIMARY}/ against kagent-adk {PRIMARY}")
    tree = patched_tree(PRIMARY, stat=True)
    changed = changed_python(tree)
    say(f"\n== ruff (upstream configuration) on {len(changed)} changed files")
    lint(tree, changed, PRIMARY)
    run(python(), "-m", "py_compile", *(str(tree / name) for name in changed))
    functions, files = count_tests(tree)
    say(f"\n== the patches' tests on kagent-adk {PRIMARY}: NOT RUN")
    say(f"   {functions} tests in {files} files were linted and compiled, not run: {NOT_RUNNABLE}.")
    say(f"   What runs instead: the same changes' tests on the backports {', '.join(SUPPORTED)} (./upstream-diff")
    say("   check with KAGENT_ADK_VERSION set to each), and this package's suite in entry-point mode against them.")
    return tree


def check_base(version: str, *, entry_point_mode: bool, pytest: list[str]) -> None:
    """Check ``version``'s series (see the module docstring); ``pytest`` is this package's run in entry-point
    mode. Refused for a base neither supported nor 1.0.0a17."""
    if version == PRIMARY:
        primary = check_primary()
        port_report(None, primary, fail_on_loss=False)
        return
    if version not in SUPPORTED:
        raise SystemExit(f"upstream-diff: kagent-adk {version} is neither supported ({SUPPORTED}) nor {PRIMARY}")
    say(f"==== the backport series: patches/v{version}/ against kagent-adk {version}")
    suite = suite_beside(version, pytest) if entry_point_mode else None
    try:
        tree = patched_tree(version, stat=True)
        changed = changed_python(tree)
        say(f"\n== ruff (upstream configuration) on {len(changed)} changed files")
        lint(tree, changed, version)
        say("\n== the patches' tests on the patched tree")
        patched = {"PYTHONPATH": str(tree / SOURCE), **ENVIRONMENT}
        (tree / PACKAGE / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
        tests = (python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tree / TESTS))
        run(*tests, cwd=tree / PACKAGE, env=patched)
        primary = check_primary()
        port_report(tree, primary, fail_on_loss=True)
    except BaseException:
        if suite is not None:
            suite.stop()
        raise
    if suite is not None:
        say("\n== this package's suite in entry-point mode (no runtime patching), run beside the checks above")
        suite.finish()


def suite_beside(version: str, pytest: list[str]) -> Beside | None:
    """This package's suite in entry-point mode (``pytest``), started now against a tree of its own with
    ``version``'s series applied, beside the checks, which keep to one core; None when the series does not apply
    as a whole (the checks then say which patch and why)."""
    tree = scratch(f"upstream-diff-{version}-suite-")
    pristine(tree, version)
    try:
        apply_series(tree, version, stat=False)
    except SystemExit:
        say("the series does not apply as a whole: the checks below say where")
        return None
    patched = {"PYTHONPATH": str(tree / SOURCE), **ENVIRONMENT}
    return Beside(python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest, cwd=ROOT, env=patched)

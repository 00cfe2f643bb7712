"""upstream-diff: the PR series in patches/v<base>/ against pristine kagent-adk <base>, one series per base.

The primary series is patches/v1.0.0a17/, against the newest upstream source there is: the kagent-adk 1.0.0a17
wheel (kagent's next release is 1.0; every 1.0 alpha is newer than the main snapshot that can be read here).
The series for the supported releases, 0.9.11 and 0.10.4, are its backports. kagent-adk 1.0 cannot be installed
here (it requires kagent-proto, which the package registry does not serve), so the 1.0 series is applied and
linted but its tests are not run; the check says so each time. The backports' tests run, and so does this
package's suite in entry-point mode against the patched backport.

The base is --base, else $KAGENT_ADK_VERSION, else the kagent-adk installed in the project's virtualenv.

    ./upstream-diff check     for a supported base: each patch applied alone to pristine sources (a patch
                              that needs another says so in a "Depends-on: NNNN" line), its index lines naming
                              the pristine blobs (pre-image) and what it makes (post-image), each alone again
                              with git am -3 onto a base that moved a line of its context; the series applied
                              strictly (no fuzz, no 3-way), ruff with upstream's configuration, the patches'
                              tests; then the same for the 1.0.0a17 series (tests not run, said so); the port
                              report; this package's suite in entry-point mode against the patched base.
                              With --base 1.0.0a17: the 1.0 series and the port report only
    ./upstream-diff port      the port report: every upstream name the package patches, subclasses, overrides
                              or imports at run time (adk/upstream.PORT_NAMES), found in the base and in the
                              1.0.0a17 sources, with its signature in each
    ./upstream-diff show      the series with each patch's subject and diffstat
    ./upstream-diff apply DIR a git working tree in DIR: pristine base commit plus one commit per patch
    ./upstream-diff regenerate DIR   rewrite patches/v<base>/ from DIR's commits on top of its base commit,
                              each commit cut from the pristine base alone (its index lines name pristine blobs)
    ./upstream-diff export DIR OUT   DIR's commits cut the same way into OUT, for submission: refused while any
                              commit carries the placeholder sign-off or lacks its author's Signed-off-by, or
                              when its changes are not those of patches/v<base>/

Pristine sources are a wheel's own files (its RECORD) under the upstream repository's path: the supported
releases' from the virtualenv (.venv-<base>, or $KAGENT_GOVERNED_MEMORY_VENV), 1.0.0a17's from the registry
(pip download --no-deps), checked against the sha256 recorded here. Nothing downloaded is kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from upstream_diff.check import check_base
from upstream_diff.mails import patches, read_series
from upstream_diff.port import report
from upstream_diff.pristine import pristine
from upstream_diff.releases import PRIMARY, ROOT, SUPPORTED, base
from upstream_diff.series import apply_series, cut, export_series
from upstream_diff.shell import run, say, scratch


def check(arguments: argparse.Namespace) -> None:
    check_base(base(), entry_point_mode=not arguments.skip_entry_point_mode, pytest=arguments.pytest)


def port(arguments: argparse.Namespace) -> None:
    report(arguments.json)


def show(_: argparse.Namespace) -> None:
    for patch in read_series(base()):
        subject = next(line for line in patch.read_text().splitlines() if line.startswith("Subject:"))
        say(f"\n{patch.name}\n  {subject}")
        say(run("git", "apply", "--stat", str(patch), cwd=ROOT, quiet=True).rstrip())


def releases(_: argparse.Namespace) -> None:
    print(*SUPPORTED)  # noqa: T201  (the command's answer)


def apply(arguments: argparse.Namespace) -> None:
    tree = Path(arguments.directory).resolve()
    if tree.exists() and any(tree.iterdir()):
        raise SystemExit("upstream-diff: the directory must be empty or new")
    tree.mkdir(parents=True, exist_ok=True)
    pristine(tree, base())
    apply_series(tree, base(), stat=False)
    say(f"{tree}: pristine base plus {len(read_series(base()))} commits; edit, commit, then ./upstream-diff regenerate")


def regenerate(arguments: argparse.Namespace) -> None:
    tree = Path(arguments.directory).resolve()
    target = patches(base())
    staged = scratch("upstream-regenerate-")
    names = cut(tree, staged)  # nothing in patches/ changes unless every commit is cut
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.patch"):
        old.unlink()
    for name in names:
        shutil.copyfile(staged / name, target / name)
    (target / "series").write_text("\n".join(names) + "\n")
    say(f"{target.relative_to(ROOT)}/: {len(names)} patches cut from the pristine base of {tree}")


def export(arguments: argparse.Namespace) -> None:
    target = Path(arguments.output).resolve()
    names = export_series(Path(arguments.directory).resolve(), target, read_series(base()))
    say(f"{target}: {len(names)} re-signed patches cut from pristine kagent-adk {base()}, ready to send")


HANDLERS: dict[str | None, Callable[[argparse.Namespace], None]] = {
    "check": check,
    "port": port,
    "show": show,
    "apply": apply,
    "regenerate": regenerate,
    "export": export,
    "releases": releases,
    None: check,
}


def command_line() -> argparse.ArgumentParser:
    """The verbs, their options and their help."""
    parser = argparse.ArgumentParser(
        prog="upstream-diff", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--base", help=f"{', '.join(SUPPORTED)} or {PRIMARY} (default: $KAGENT_ADK_VERSION)")
    commands = parser.add_subparsers(dest="command")
    checking = commands.add_parser("check", help="apply, lint and test the series")
    checking.add_argument("--skip-entry-point-mode", action="store_true", help="only the series and their tests")
    checking.add_argument(
        "pytest", nargs="*", default=["tests/runtime"], help="this package's pytest run (default: what varies with it)"
    )
    porting = commands.add_parser("port", help="the port report")
    porting.add_argument("--json", help="also write the rows to this file")
    commands.add_parser("show", help="the series with diffstats")
    commands.add_parser("releases", help="the supported releases, oldest first (what ./dev tests)")
    applying = commands.add_parser("apply", help="a working tree with the series as commits")
    applying.add_argument("directory")
    regenerating = commands.add_parser("regenerate", help="rewrite patches/ from a working tree")
    regenerating.add_argument("directory")
    exporting = commands.add_parser("export", help="the re-signed series of a working tree, for submission")
    exporting.add_argument("directory")
    exporting.add_argument("output")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run the verb ``argv`` names (the command line's, by default); no verb is ``check``."""
    parser = command_line()
    arguments = parser.parse_args(argv)
    if arguments.base:
        os.environ["KAGENT_ADK_VERSION"] = arguments.base
    handler = HANDLERS[arguments.command]
    handler(arguments if arguments.command else parser.parse_args(["check"]))

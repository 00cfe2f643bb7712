"""The commands upstream-diff runs (git, pip, ruff, pytest), one of them beside the rest, its scratch directories,
and what it prints.

A command that fails ends the run with ``SystemExit`` naming it and its exit status; what it printed goes to
stderr when it was captured.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def scratch(prefix: str) -> Path:
    """A temporary directory, removed when upstream-diff exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def say(text: str = "") -> None:
    print(text, flush=True)  # noqa: T201


def run(*command: str, cwd: Path | None = None, env: dict[str, str] | None = None, quiet: bool = False) -> str:
    """Run ``command``; with ``quiet``, capture and return its output, else let it print and return ""."""
    result = subprocess.run(
        command, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=quiet, text=True, check=False
    )
    if result.returncode != 0:
        if quiet:
            sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"upstream-diff: failed: {' '.join(command[:4])} ... (exit {result.returncode})")
    return result.stdout if quiet else ""


class Beside:
    """``command`` started now, beside what the caller does next, its output held in a scratch file: ``finish``
    waits for it, prints what it printed and fails as ``run`` does; ``stop`` ends it unfinished."""

    def __init__(self, *command: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self._command = command
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 (held until finish or stop)
        environment = {**os.environ, **(env or {})}
        output, merged = self._output, subprocess.STDOUT
        self._process = subprocess.Popen(command, cwd=cwd, env=environment, stdout=output, stderr=merged)

    def finish(self) -> None:
        code = self._process.wait()
        self._output.seek(0)
        sys.stdout.flush()
        sys.stdout.buffer.write(self._output.read())
        sys.stdout.buffer.flush()
        self._output.close()
        if code != 0:
            raise SystemExit(f"upstream-diff: failed: {' '.join(self._command[:4])} ... (exit {code})")

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait()
        self._output.close()


IDENTITY = ("-c", "user.name=upstream-diff", "-c", "user.email=upstream-diff@localhost")  # commits in scratch trees


def git(tree: Path, *args: str) -> str:
    return run("git", *IDENTITY, *args, cwd=tree, quiet=True)

"""The main job: ``kagent-memory-governed demo`` runs the governed lifecycle through upstream's runtime on the
embedded default, the same every run, and prints the evidence of each step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import run_command as run

from kagent_memory_governed.store import Store


def _without_ids_and_times(output: str) -> str:
    output = re.sub(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", "<id>", output)
    output = re.sub(r"!demo[0-9a-f]+:", "!<room>:", output)
    return re.sub(r"\d{4}-\d\d-\d\dT[0-9:.]+Z", "<time>", output)


@pytest.mark.long
def test_the_demo_runs_the_whole_lifecycle_through_the_runtime_on_the_embedded_default(tmp_path: Path) -> None:
    result = run("demo", KAGENT_GOVERNED_MEMORY_DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    again = run("demo", KAGENT_GOVERNED_MEMORY_DATA_DIR=str(tmp_path))
    assert _without_ids_and_times(again.stdout) == _without_ids_and_times(result.stdout)  # the same every run
    assert result.stderr == ""
    steps = result.stdout.split("\n== ")[1:]
    expected = [
        ("migrate", f"schema revision {Store.head_revision()}"),
        ("before consent", "Memory unavailable: consent_missing", "enabled=False entries=0"),
        ("consent", "'generation': 1"),
        ("saves a fact", "Saved to long-term memory", "entries=1"),
        ("prefetch recalls", '"remembered_facts_in_context": 1'),
        ("inspect", "control-room:!demo", "'I take my coffee black.'"),
        ("forget exactly", "'deleted': True, 'verified': True", "entries=0"),
        ("hard expiry", "7 days later: entries=0", '"remembered_facts_in_context": 0', "sweep physically deleted"),
        ("off", "'enabled': False", "'verified': True", "consent_disabled", "last erasure=verified"),
    ]
    assert len(steps) == len(expected)
    for step, (title, *evidence) in zip(steps, expected, strict=True):
        assert title in step.splitlines()[0]
        for text in evidence:
            assert text in step, (title, text)

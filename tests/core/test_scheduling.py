"""The suite's order under ./dev's ``--dist worksteal``: the modules holding a long test first, each whole and in
its own order, so that neither worker is left alone with a long test at the end and no module's fixtures are set
up twice on a worker."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
from conftest import pytest_collection_modifyitems


@dataclass
class Item:
    """What the ordering reads of a collected test: its module's path and its ``long`` mark."""

    path: Path
    name: str
    long: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "long" and self.long else None


def test_the_modules_holding_a_long_test_go_first_whole_and_in_order() -> None:
    a, b, c = Path("test_a.py"), Path("test_b.py"), Path("test_c.py")
    items = [Item(a, "a1"), Item(a, "a2"), Item(b, "b1"), Item(b, "b2", long=True), Item(b, "b3")]
    items += [Item(c, "c1", long=True), Item(c, "c2")]

    pytest_collection_modifyitems(cast(list[pytest.Item], items))

    assert [item.name for item in items] == ["b1", "b2", "b3", "c1", "c2", "a1", "a2"]


def test_dev_runs_every_suite_with_work_stealing() -> None:
    dev = (Path(__file__).resolve().parents[2] / "dev").read_text()
    assert 'XDIST=(-n "$WORKERS" --dist worksteal)' in dev
    assert dev.count('"${XDIST[@]}"') == 4  # tests/core, tests/runtime, REMOTE_SUITE, the entry-point suite

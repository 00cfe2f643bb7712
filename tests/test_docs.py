"""The documents cite tests by name; every cited test exists, so a rename cannot leave a guarantee unproven."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEFINED = {
    name
    for path in (ROOT / "tests").glob("test_*.py")
    for name in re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE)
}


@pytest.mark.parametrize("document", ["docs/operator.md", "docs/privacy.md", "docs/bridge.md", "README.md"])
def test_every_test_a_document_cites_exists(document: str):
    cited = set(re.findall(r"`(test_\w+)`", (ROOT / document).read_text()))
    assert cited - DEFINED == set()

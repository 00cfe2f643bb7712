"""The documents cite tests by name; every cited test exists, so a rename cannot leave a guarantee unproven."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEFINED = {
    name
    for path in (ROOT / "tests").rglob("test_*.py")
    for name in re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE)
}


@pytest.mark.parametrize("document", ["docs/operator.md", "docs/privacy.md", "docs/bridge.md", "README.md"])
def test_every_test_a_document_cites_exists(document: str) -> None:
    cited = set(re.findall(r"`(test_\w+)`", (ROOT / document).read_text()))
    assert cited - DEFINED == set()


def test_the_bridge_guide_states_every_call_of_the_contract_as_the_code_has_it() -> None:
    """docs/bridge.md is the contract for people; ``contract.CALLS`` is the one the server and client read."""
    from kagent_memory_governed.contract import CALLS

    stated = {
        (method, path.split("?")[0], op, lifetime)
        for method, path, op, lifetime in re.findall(
            r"^(GET|POST|DELETE) (\S+) +token: op \"([a-z-]+)\", (single use|reusable until it expires)$",
            (ROOT / "docs/bridge.md").read_text(),
            re.MULTILINE,
        )
    }
    documented = {(m, re.sub(r"/[0-9a-f-]{36}$", "/{entry_id}", p), op, life) for m, p, op, life in stated}
    expected = {
        (call.method, call.route, call.op.value, "single use" if call.single_use else "reusable until it expires")
        for call in CALLS.values()
    }
    assert documented == expected

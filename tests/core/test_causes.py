"""An error's cause is a ``Cause``: no raise site names one as free text, every member is one the package gives,
and docs/operator.md lists exactly them; the contract re-exports ``Cause`` beside ``Reason``."""

from __future__ import annotations

import ast
import http
import re
from pathlib import Path

import grpc

from kagent_memory_governed import contract
from kagent_memory_governed.errors import GRPC_CAUSES, Cause, GovernedMemoryError, Reason, grpc_cause, http_cause
from kagent_memory_governed.keys import openbao
from kagent_memory_governed.store.erasure import failure_cause

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kagent_memory_governed"
SOURCES = {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}

# what the mapping functions give, for the prefixes the package passes them
HTTP_CODES = range(100, 1000)
HTTP_PREFIXES = ("status_", "discovery_http_", "jwks_http_")
FETCHES = ("discovery", "jwks")  # service/identity.py ``_get``: ``Cause(f"{what}_<failure>")``
FETCH_FAILURES = ("too_large", "malformed", "tls_untrusted_certificate", "timeout", "unreachable")


def _is_text(node: ast.expr) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(node, ast.JoinedStr)


def test_no_cause_in_the_package_is_a_bare_string() -> None:
    """Every ``cause=`` names a member (or an expression giving one), never a string literal or an f-string."""
    bare = [
        f"{path.relative_to(ROOT)}:{keyword.value.lineno}"
        for path, tree in SOURCES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for keyword in node.keywords
        if keyword.arg == "cause" and _is_text(keyword.value)
    ]
    assert bare == []


def _produced() -> set[Cause]:
    named = {
        Cause[node.attr]
        for tree in SOURCES.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Cause"
        if node.attr in Cause.__members__
    }
    mapped = {http_cause(prefix, code) for prefix in HTTP_PREFIXES for code in HTTP_CODES}
    mapped |= set(GRPC_CAUSES.values())
    mapped |= {Cause(f"missing_{capability}_{kind}") for kind, needs in openbao._NEEDS.items() for capability in needs}
    mapped |= {Cause(f"{what}_{failure}") for what in FETCHES for failure in FETCH_FAILURES}
    mapped |= {failure_cause(GovernedMemoryError(reason)) for reason in Reason}
    return named | mapped


def test_every_cause_is_one_the_package_gives() -> None:
    """No member is dead: each is named (``Cause.X``) or given by a mapping the package calls."""
    assert set(Cause) - _produced() == set()


def test_the_mappings_the_package_calls_are_where_it_calls_them() -> None:
    """``_produced`` counts the mappings by the prefixes and compositions the package passes: they are there."""
    text = {path.relative_to(PACKAGE).as_posix(): path.read_text() for path in SOURCES}
    assert 'http_cause("status_", status)' in text["keys/http.py"]
    assert 'http_cause("status_", status)' in text["keys/openbao.py"]
    assert 'http_cause(f"{what}_http_", answer.status_code)' in text["service/identity.py"]
    assert 'Cause(f"missing_{capability}_{kind}")' in text["keys/openbao.py"]
    assert {what for what in FETCHES if f'"{what}")' in text["service/identity.py"]} == set(FETCHES)  # self._get's


def test_composed_causes_are_members() -> None:
    """The compositions the package looks up are each a member: the lookups cannot fail."""
    for kind, needs in openbao._NEEDS.items():
        for capability in needs:
            assert Cause(f"missing_{capability}_{kind}").name == f"MISSING_{capability}_{kind}".upper()
    for what in FETCHES:
        for failure in FETCH_FAILURES:
            assert Cause(f"{what}_{failure}")


def test_http_statuses_are_named_by_code_where_http_status_names_them() -> None:
    registered = {status.value for status in http.HTTPStatus}
    for code in HTTP_CODES:
        for prefix in ("discovery_http_", "jwks_http_"):
            expected = f"{prefix}{code}" if code in registered and 201 <= code <= 511 else f"{prefix}other"
            assert http_cause(prefix, code) == expected
        keyed = (code in registered and 201 <= code <= 511 and code not in (403, 503)) or code in (472, 473)
        assert http_cause("status_", code) == (f"status_{code}" if keyed else "status_other")


def test_grpc_statuses_are_named_by_their_name() -> None:
    for code in grpc.StatusCode:
        expected = Cause.BAD_ANSWER if code is grpc.StatusCode.OK else Cause(code.name.lower())
        assert grpc_cause(code.name) is expected
    assert grpc_cause("NO_SUCH_STATUS") is Cause.BAD_ANSWER


def test_an_erasure_names_a_failure_without_a_cause_by_its_reason_code() -> None:
    assert failure_cause(GovernedMemoryError(Reason.KEY_UNAVAILABLE, cause=Cause.IO_ERROR)) is Cause.IO_ERROR
    for reason in (Reason.STORE_UNAVAILABLE, Reason.BAD_INPUT, Reason.KEY_UNAVAILABLE):
        assert failure_cause(GovernedMemoryError(reason)) == reason.value
    assert failure_cause(RuntimeError("anything")) is Cause.INTERNAL_ERROR


def test_an_error_shows_a_detail_in_its_cause_s_place() -> None:
    newer = GovernedMemoryError(Reason.SCHEMA_NEWER, detail="database at 9, this package migrates to 8")
    assert (newer.cause, newer.explained()) == (None, "schema_newer (database at 9, this package migrates to 8)")
    timeout = GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause=Cause.TIMEOUT)
    assert (str(timeout), timeout.explained(), timeout.shown) == (
        "store_unavailable",
        "store_unavailable (timeout)",
        "timeout",
    )


def test_causes_are_codes() -> None:
    """Lower-case codes; the ledger's column takes up to 32 characters (longer ones are identity_unavailable's, which
    no ledger row records)."""
    assert all(re.fullmatch("[a-z][a-z0-9_]*", cause) for cause in Cause)
    assert {cause for cause in Cause if len(cause) > 32} <= {Cause(f"{w}_tls_untrusted_certificate") for w in FETCHES}


def _documented() -> set[str]:
    guide = (ROOT / "docs/operator.md").read_text()
    section = guide.split("\n## Causes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {code for row in rows for code in re.findall(r"`([a-z0-9_<>]+)`", row.split(" | ")[0])}
    patterns = {code for code in named if code.endswith("_<code>")}
    expanded = {
        cause.value
        for pattern in patterns
        for cause in Cause
        if re.fullmatch(re.escape(pattern.removesuffix("<code>")) + "[0-9]{3}", cause.value)
    }
    return (named - patterns) | expanded


def test_the_operator_guide_lists_every_cause() -> None:
    """docs/operator.md's table of causes is ``Cause``, member for member."""
    assert _documented() == {cause.value for cause in Cause}


def test_the_contract_lists_cause_beside_reason() -> None:
    assert (contract.Cause, contract.Reason) == (Cause, Reason)
    assert {"Cause", "Reason"} <= set(contract.__all__)

"""The port report's list is complete and holds on the installed release.

Every upstream name the package patches, subclasses, overrides or imports at run time is in
``adk.upstream.PORT_NAMES`` (found in the package's own source); the installed kagent-adk has each one, read from
its sources as ``./upstream-diff port`` reads 1.0.0a17's, so CI fails when a supported release loses one; and that
reading tells a missing, a changed, an extended and a protobuf-replaced name apart.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from upstream_diff import port, signatures

from kagent_memory_governed.adk import upstream

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kagent_memory_governed"
UPSTREAM = ("kagent", "google.adk", "google.genai", "a2a")
LISTED = {entry.name for entry in upstream.PORT_NAMES}


def is_upstream(module: str) -> bool:
    return any(module == root or module.startswith(root + ".") for root in UPSTREAM)


def run_time_nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``, which never runs."""
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def used_names(source: Path) -> set[str]:
    """Upstream names one module of the package imports, subclasses, overrides (candidates) or assigns to."""
    nodes = run_time_nodes(ast.parse(source.read_text()))
    aliases: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and is_upstream(node.module):
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names if is_upstream(a.name)})

    def dotted(expression: ast.expr) -> str | None:
        head, _, tail = ast.unparse(expression).partition(".")
        return f"{aliases[head]}.{tail}".rstrip(".") if head in aliases else None

    found = set(aliases.values())
    for node in nodes:
        if isinstance(node, ast.ClassDef):
            for base in filter(None, map(dotted, node.bases)):
                found.add(base)
                methods = [s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
                found.update(f"{base}.{method}?" for method in methods)  # overrides if upstream has them
        if isinstance(node, ast.Assign):
            found.update(filter(None, (dotted(t) for t in node.targets if isinstance(t, ast.Attribute))))
    return found


def imported_from(package: str) -> Path:
    """The directory the installed ``package`` is imported from."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def site() -> list[Path]:
    """Where the installed kagent-adk is read from: the patched tree first in entry-point mode."""
    return list(dict.fromkeys(imported_from(package).parents[1] for package in ("kagent.adk", "kagent.core")))


@pytest.fixture(scope="module")
def used(site: list[Path]) -> set[str]:
    """What the package's source imports, subclasses, overrides (where upstream has the method) and rebinds."""
    candidates = set().union(*(used_names(source) for source in PACKAGE.rglob("*.py")))
    overrides = {name[:-1] for name in candidates if name.endswith("?")}
    found = {name for name in candidates if not name.endswith("?")}
    return found | {name for name in overrides if signatures.describe(site, name) is not None}


def test_every_upstream_name_the_package_uses_is_listed(used: set[str]) -> None:
    assert sorted(used - LISTED) == []


def test_every_listed_import_subclass_and_override_is_still_used(used: set[str]) -> None:
    found_by_source = {upstream.Use.IMPORTED, upstream.Use.SUBCLASSED, upstream.Use.OVERRIDDEN}
    assert sorted(e.name for e in upstream.PORT_NAMES if e.use in found_by_source and e.name not in used) == []


def test_every_runtime_patch_target_is_listed() -> None:
    assert {f"{module}.{name}" for module, name in upstream.RUNTIME_PATCH_TARGETS} <= LISTED


@pytest.mark.parametrize("entry", upstream.PORT_NAMES, ids=lambda entry: entry.name)
def test_the_installed_release_has_every_listed_name(entry: upstream.UpstreamName, site: list[Path]) -> None:
    if entry.use is upstream.Use.SERIES and importlib.util.find_spec("kagent.adk.extensions") is None:
        pytest.skip("runtime-patching mode: the series' names are checked by ./upstream-diff check")
    assert signatures.describe(site, entry.name) is not None


def test_the_port_report_tells_changes_apart(tmp_path: Path) -> None:
    before, after = tmp_path / "before", tmp_path / "after"
    sources = {
        before: """
from ._gen_pb2 import Config as Unused
class Tool:
    def __init__(self, name): ...
    async def run(self, *, args, context): ...
def split(text): ...
def gone(): ...
class Builder:
    async def build(self, params=None, context=None): ...
""",
        after: """
from ._gen_pb2 import Config as Tool
_LAZY_MAPPING = {"split": (".helpers", "split")}
class Builder:
    async def build(self, context, params=None): ...
""",
    }
    for root, text in sources.items():
        (root / "pkg").mkdir(parents=True)
        (root / "pkg/__init__.py").write_text(text)
    (after / "pkg/helpers.py").write_text("def split(text, limit=None): ...\n")

    def verdict(name: str) -> str:
        return port.verdict(signatures.describe([before], name), signatures.describe([after], name))

    assert verdict("pkg.split") == "extended"  # a parameter with a default added, behind a lazy export
    assert verdict("pkg.gone") == "missing"
    assert verdict("pkg.Builder.build") == "changed"  # the call context moved to the front
    assert verdict("pkg.Tool") == "now protobuf"
    assert verdict("pkg.Builder") == "same"

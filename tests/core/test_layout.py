"""The layout keeps its promises: the package is made of parts, each importing only the parts below it (lazy and
type-only imports included, so a layer broken inside a function or under ``TYPE_CHECKING`` fails too); nothing
imports in a circle; the settings know no store, key store or service (the door builds those from them); the two
clients (the runtime's data-plane client and the bridge's) import nothing of the store, the key stores or the
servers; and no module outgrows a reader."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "kagent_memory_governed"
ROOT = "kagent_memory_governed"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, eager_only: bool) -> set[str]:
    """The package modules ``path`` imports; ``eager_only``: at import time (not in functions or TYPE_CHECKING)."""
    tree, found, here = ast.parse(path.read_text()), set[str](), _module(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            lazy = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            )
            if isinstance(child, ast.ImportFrom) and (eager or not eager_only):
                base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1]) if child.level else ""
                module = ".".join(part for part in (base, child.module or "") if part)
                names = [module] + [f"{module}.{alias.name}" for alias in child.names]
                found.update(name for name in names if name.startswith(ROOT))
            elif isinstance(child, ast.Import) and (eager or not eager_only):
                found.update(alias.name for alias in child.names if alias.name.startswith(ROOT))
            visit(child, eager and not lazy)

    visit(tree, True)
    return found


MODULES = {_module(path): path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts}


def _resolved(names: set[str]) -> set[str]:
    """The modules among ``names``: ``from package import name`` names a module, or an attribute of the package."""
    return {name for name in names if name in MODULES} | {
        name.rpartition(".")[0] for name in names if name not in MODULES and name.rpartition(".")[0] in MODULES
    }


# The parts, by module (a module belongs to the part of its longest prefix), and what each may import besides
# itself. Lower parts know nothing of higher ones: the door (the CLI, activation, doctor, the package's own
# namespace) reads the settings and hands values down.
PARTS = {
    "core": (
        "errors",
        "scope",
        "clock",
        "policy",
        "consent",
        "limits",
        "assertion",
        "ed25519",
        "redaction",
        "metering",
        "health",
        "lazy",
        "embedding",
    ),
    "contract": (
        "contract",
        "service.wire",
        "service.values",
        "service.plane",
        "service.data_plane_pb2",
        "service.data_plane_pb2_grpc",
    ),
    "keys": ("keys",),
    "store": ("store", "schema"),
    "client": ("service.remote", "service.exchange", "bridge"),
    "configuration": ("settings", "mode", "embedded"),
    "service": ("service", "service.server", "service.messages", "service.identity", "service.process", "control"),
    "adapters": ("adk",),
    "testing": ("testing",),
    "door": ("cli", "doctor", "activation", ""),
}
MAY_IMPORT = {
    "core": set(),
    "contract": {"core"},
    "keys": {"core"},
    "store": {"core", "contract", "keys"},
    "client": {"core", "contract"},
    "configuration": {"core", "contract", "keys", "store", "client"},
    "service": {"core", "contract", "keys", "store", "configuration"},
    "adapters": {"core", "contract", "store", "client", "configuration", "service"},
    "testing": set(PARTS) - {"testing", "door"},
    "door": set(PARTS) - {"door"},
}
# within its part, what a module may import: the settings are a typed model of the environment, nothing more
ONLY = {f"{ROOT}.settings": {"core"}}


def _part(name: str) -> str:
    relative = name.removeprefix(ROOT).removeprefix(".")
    matches = [
        (len(prefix), part)
        for part, prefixes in PARTS.items()
        for prefix in prefixes
        if relative == prefix or (prefix and relative.startswith(f"{prefix}."))
    ]
    assert matches, f"{name} belongs to no part: name it in PARTS"
    return max(matches)[1]


def _graph() -> dict[str, set[str]]:
    """Every import, lazy and type-only ones included; a submodule naming its own package is Python's order."""
    return {
        name: {imported for imported in _resolved(_imports(path, eager_only=False)) if not name.startswith(imported)}
        for name, path in MODULES.items()
    }


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_imports_only_the_parts_below_its_own(name: str) -> None:
    part = _part(name)
    allowed = ONLY.get(name, MAY_IMPORT[part] | {part})
    for imported in _graph()[name]:
        assert _part(imported) in allowed, f"{name} ({part}) imports {imported} ({_part(imported)})"


def test_nothing_imports_in_a_circle() -> None:
    graph, done = _graph(), set()

    def walk(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, " -> ".join((*trail, name))
        if name not in done:
            for imported in graph[name]:
                walk(imported, (*trail, name))
            done.add(name)

    for name in graph:
        walk(name, ())


def test_the_parts_form_no_circle_either() -> None:
    for part, allowed in MAY_IMPORT.items():
        for other in allowed:
            assert part not in MAY_IMPORT[other], f"{part} and {other} may import each other"


# What an agent pod in remote mode runs (it holds no database credential) and what a bridge imports: neither may
# load the store, the key stores, the migrations, the control API's server side or the memory service's processes.
CLIENTS = [f"{ROOT}.service.remote", f"{ROOT}.bridge"]
SERVER_SIDE = re.compile(rf"{ROOT}\.(store|keys|migrations|control|service\.server|service\.process)(\.|$)")


def _loaded_with(name: str) -> set[str]:
    """Every package module importing ``name`` runs at import time: its packages' ``__init__``, and what each of
    those imports eagerly, transitively (as written: a module outside ``MODULES``, such as a migration, is named)."""
    found, frontier = set(), [name]
    while frontier:
        module = frontier.pop()
        if module in found:
            continue
        found.add(module)
        parents = {module.rsplit(".", depth)[0] for depth in range(1, module.count(".") + 1)}
        imported = _imports(MODULES[module], eager_only=True) if module in MODULES else set()
        found |= imported - set(MODULES)
        frontier.extend(_resolved(imported | parents) - found)
    return found


@pytest.mark.parametrize("client", CLIENTS)
def test_the_clients_import_nothing_of_the_server_side(client: str) -> None:
    assert sorted(name for name in _loaded_with(client) if SERVER_SIDE.match(name)) == []


@pytest.mark.parametrize("name", sorted(name for name in MODULES if "_pb2" not in name))  # generated: read the .proto
def test_no_module_outgrows_a_reader(name: str) -> None:
    assert len(MODULES[name].read_text().splitlines()) <= 360

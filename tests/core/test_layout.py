"""The layout keeps its promises: imports go one way (activation, then the ADK adapters, then the core),
nothing imports in a cycle, the runtime never imports the test doubles, the two clients (the runtime's data-plane
client and the bridge's) import nothing of the store, the key stores or the servers, and no module outgrows a
reader."""

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
    tree, found = ast.parse(path.read_text()), set()

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            lazy = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            )
            if isinstance(child, ast.ImportFrom) and child.module and (eager or not eager_only):
                names = [child.module] + [f"{child.module}.{alias.name}" for alias in child.names]
                found.update(name for name in names if name.startswith(ROOT))
            elif isinstance(child, ast.Import) and (eager or not eager_only):
                found.update(alias.name for alias in child.names if alias.name.startswith(ROOT))
            visit(child, eager and not lazy)

    visit(tree, True)
    return found


MODULES = {_module(path): path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts}


def _resolved(names: set[str]) -> set[str]:
    return {name for name in names if name in MODULES}


def test_no_module_imports_itself_back_at_import_time():
    graph = {name: _resolved(_imports(path, eager_only=True)) - {name} for name, path in MODULES.items()}
    done: set[str] = set()

    def walk(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, " -> ".join((*trail, name))
        if name in done:
            return
        for imported in graph[name]:
            if not name.startswith(imported + "."):  # a submodule naming its own package is Python's order
                walk(imported, (*trail, name))
        done.add(name)

    for name in graph:
        walk(name, ())


def _layer(name: str) -> int:
    if name.startswith(f"{ROOT}.testing"):
        return 3
    if name in (f"{ROOT}.activation", f"{ROOT}.cli", f"{ROOT}.doctor", ROOT):
        return 2
    return 1 if name.startswith(f"{ROOT}.adk") else 0


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_one_way(name: str):
    """The core never imports the adapters or activation; nothing but the CLI imports the test doubles."""
    for imported in _resolved(_imports(MODULES[name], eager_only=False)):
        if name == f"{ROOT}.cli" and imported.startswith(f"{ROOT}.testing"):
            continue  # the demo command, imported when asked for
        assert _layer(imported) <= _layer(name) or imported == ROOT, f"{name} imports {imported}"


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
def test_the_clients_import_nothing_of_the_server_side(client: str):
    assert sorted(name for name in _loaded_with(client) if SERVER_SIDE.match(name)) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_outgrows_a_reader(name: str):
    assert len(MODULES[name].read_text().splitlines()) <= 360

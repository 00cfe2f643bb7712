"""An upstream name's signature, read from source, never imported (kagent-adk 1.0 cannot be imported here).

A name is a dotted path, module[.Class[.method]]; its signature is what a caller or a subclass depends on: a
function's parameters, a class's bases and own __init__, a module attribute bound by import or assignment. Two
signatures compare as a caller would: ``compatible`` when every use of the one still works against the other.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path


def module_file(roots: list[Path], module: str) -> Path | None:
    for root in roots:
        path = root.joinpath(*module.split("."))
        if (path / "__init__.py").exists():
            return path / "__init__.py"
        if path.with_suffix(".py").exists():
            return path.with_suffix(".py")
    return None


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def top_level(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's statements at run time: into if/try blocks (not ``if TYPE_CHECKING``), never into defs."""
    for statement in statements:
        if isinstance(statement, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(statement.test):
                yield from top_level(statement.body)
            yield from top_level(statement.orelse)
        elif isinstance(statement, ast.Try):
            for block in (statement.body, *(h.body for h in statement.handlers), statement.orelse):
                yield from top_level(block)
        else:
            yield statement


def absolute(module: str, is_package: bool, target: ast.ImportFrom) -> str:
    if not target.level:
        return target.module or ""
    parts = module.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - target.level + 1]
    return ".".join([*anchor, *([target.module] if target.module else [])])


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults: list[ast.expr | None] = [*[None] * (len(positional) - len(arguments.defaults)), *arguments.defaults]
    shown = [a.arg + ("=…" if d is not None else "") for a, d in zip(positional, defaults, strict=True)]
    if arguments.posonlyargs:
        shown.insert(len(arguments.posonlyargs), "/")
    if arguments.vararg:
        shown.append(f"*{arguments.vararg.arg}")
    elif arguments.kwonlyargs:
        shown.append("*")
    shown += [
        a.arg + ("=…" if d is not None else "")
        for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
    ]
    if arguments.kwarg:
        shown.append(f"**{arguments.kwarg.arg}")
    kind = "async def" if isinstance(function, ast.AsyncFunctionDef) else "def"
    decorators = [ast.unparse(d) for d in function.decorator_list]
    special = [d for d in decorators if d in ("property", "classmethod", "staticmethod")]
    return " ".join([*(f"@{d}" for d in special), f"{kind}({', '.join(shown)})"])


def class_signature(node: ast.ClassDef) -> str:
    bases = ", ".join(ast.unparse(b) for b in node.bases)
    init = [s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "__init__"]
    return f"class({bases})" + (f" __init__{parameters(init[0])[3:]}" if init else "")


def describe(roots: list[Path], name: str, depth: int = 0) -> str | None:
    """``name``'s signature in the sources under ``roots``, or None when they do not have it."""
    if depth > 12:
        return "unresolved (import cycle)"
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        module, attributes = ".".join(parts[:split]), parts[split:]
        path = module_file(roots, module)
        if path is not None:
            return lookup(roots, module, path, attributes, depth) if attributes else "module"
    return None


def lookup(roots: list[Path], module: str, path: Path, attributes: list[str], depth: int) -> str | None:
    first, rest = attributes[0], attributes[1:]
    is_package = path.name == "__init__.py"
    lazy: dict[str, tuple[str, str]] = {}
    for statement in top_level(parsed(path).body):
        if isinstance(statement, ast.ClassDef) and statement.name == first:
            return member(roots, module, path, statement, rest, depth) if rest else class_signature(statement)
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == first:
            return None if rest else parameters(statement)
        if isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if (alias.asname or alias.name) == first:
                    source = absolute(module, is_package, statement)
                    target = f"{source}.{alias.name}"
                    if source.endswith("_pb2"):  # generated protobuf: classes built at import, never in source
                        return f"protobuf message {target}"
                    found = describe(roots, ".".join([target, *rest]), depth + 1)
                    if found is None and module_file(roots, source) is None:
                        return f"from {target} (outside the sources read)"
                    return found
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.asname == first or (alias.asname is None and alias.name.split(".")[0] == first):
                    return describe(roots, ".".join([alias.name, *rest]), depth + 1)
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            value = statement.value
            if any(n.startswith("_LAZY") for n in names) and isinstance(value, ast.Dict):
                lazy.update(lazy_exports(value))  # google-adk's exports through a module __getattr__
            if first in names and not rest:
                called = ast.unparse(value.func) if isinstance(value, ast.Call) else type(value).__name__
                return f"= {called}(…)" if isinstance(value, ast.Call) else f"= {called}"
    if first in lazy:
        relative, attribute = lazy[first]
        package = module if is_package else module.rsplit(".", 1)[0]
        target = f"{package}{relative}" if relative.startswith(".") else f"{package}.{relative}"
        return describe(roots, ".".join([target, attribute, *rest]), depth + 1)
    submodule = module_file(roots, f"{module}.{first}")
    if submodule is not None:
        return describe(roots, ".".join([module, *attributes]), depth + 1)
    return None


def lazy_exports(mapping: ast.Dict) -> dict[str, tuple[str, str]]:
    """``{"Name": ".module"}`` or ``{"Name": (".module", "Attribute")}``, as google-adk's packages spell them."""
    exports = {}
    for key, value in zip(mapping.keys, mapping.values, strict=True):
        if key is None:  # a ``**other`` entry: nothing to read
            continue
        try:
            name, target = ast.literal_eval(key), ast.literal_eval(value)
        except ValueError:
            continue
        exports[name] = (target, name) if isinstance(target, str) else tuple(target)
    return exports


def member(roots: list[Path], module: str, path: Path, node: ast.ClassDef, rest: list[str], depth: int) -> str | None:
    """A method (or nested name) of a class, looked up through its bases as Python's MRO would find it first."""
    if len(rest) != 1:
        return None
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == rest[0]:
            return parameters(statement)
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if statement.target.id == rest[0]:
                return f"field: {ast.unparse(statement.annotation)}"
    for base_node in node.bases:
        base_name = ast.unparse(base_node)
        if base_name in ("object", "Protocol", "BaseModel", "ABC", "Generic") or "[" in base_name:
            continue
        qualified = resolve_local(module, path, base_name)
        if qualified:
            found = describe(roots, f"{qualified}.{rest[0]}", depth + 1)
            if found is not None and not found.startswith("from "):
                return found
    return None


def resolve_local(module: str, path: Path, name: str) -> str | None:
    """The dotted name a module-level ``name`` (or ``module_alias.name``) refers to in ``module``."""
    head, _, tail = name.partition(".")
    for statement in top_level(parsed(path).body):
        if isinstance(statement, ast.ClassDef) and statement.name == head:
            return f"{module}.{name}"
        if isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if (alias.asname or alias.name) == head:
                    target = f"{absolute(module, path.name == '__init__.py', statement)}.{alias.name}"
                    return f"{target}.{tail}" if tail else target
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.asname == head:
                    return f"{alias.name}.{tail}" if tail else alias.name
    return None


def signature_parts(descriptor: str) -> tuple[str, list[str], list[str]]:
    """(kind, bases, parameters) of a descriptor made by ``parameters`` or ``class_signature``."""
    kind, _, rest = descriptor.partition("(")
    if kind == "class":
        bases, _, init = rest.partition(")")
        parameters_text = init.partition("__init__(")[2].rstrip(")")
        return kind, [b for b in bases.split(", ") if b], [p for p in parameters_text.split(", ") if p]
    return kind, [], [p for p in rest.rstrip(")").split(", ") if p]


def compatible(before: str, after: str) -> bool:
    """Whether every use of ``before`` still works against ``after``: the same kind, the bases kept, every
    parameter kept in its place and kind, and only parameters with defaults (or * / ** catch-alls) added."""
    kind, bases, old = signature_parts(before)
    new_kind, new_bases, new = signature_parts(after)
    if kind != new_kind or not set(bases) <= set(new_bases) or "(" not in before:
        return False
    for index, parameter in enumerate(old):
        if parameter not in new:
            return False
        positional = "*" not in old[: index + 1] and not parameter.startswith("*")
        if positional and new.index(parameter) != index:
            return False
    added = [p for p in new if p not in old]
    return all(p.endswith("=…") or p.startswith("*") or p == "/" for p in added)

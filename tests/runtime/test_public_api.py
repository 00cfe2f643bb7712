"""The public surface is curated and complete, as httpx's is: every name in ``__all__`` exists, and every value a
public call of an exported class returns or takes (and every value inside those) is exported too."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from types import UnionType

import kagent_memory_governed

PACKAGE = kagent_memory_governed.__name__


def _classes_in(annotation: object) -> set[type]:
    """The package's own classes named by a resolved annotation, through unions, generics and aliases."""
    if isinstance(annotation, type):
        found = {annotation} if annotation.__module__.startswith(PACKAGE) else set()
        return found | {c for arg in typing.get_args(annotation) for c in _classes_in(arg)}
    if isinstance(annotation, UnionType) or typing.get_origin(annotation) is not None:
        return {c for arg in typing.get_args(annotation) for c in _classes_in(arg)}
    return set()


def _reachable(cls: type) -> set[type]:
    """What a caller of ``cls``'s public methods and properties, or a reader of its fields, can be handed."""
    found: set[type] = set()
    if dataclasses.is_dataclass(cls):
        for hint in typing.get_type_hints(cls).values():
            found |= _classes_in(hint)
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") or not callable(member) and not isinstance(member, property):
            continue
        function = member.fget if isinstance(member, property) else member
        if not inspect.isfunction(function) and not inspect.ismethod(function):
            continue
        if not function.__module__.startswith(PACKAGE):
            continue
        for hint in typing.get_type_hints(function).values():
            found |= _classes_in(hint)
    return found


def test_every_exported_name_exists() -> None:
    for name in kagent_memory_governed.__all__:
        assert getattr(kagent_memory_governed, name) is not None, name


def test_every_value_a_public_call_hands_out_is_exported() -> None:
    exported = {getattr(kagent_memory_governed, name) for name in kagent_memory_governed.__all__}
    seen: set[type] = set()
    frontier = {value for value in exported if isinstance(value, type)}
    while frontier:
        cls = frontier.pop()
        seen.add(cls)
        frontier |= _reachable(cls) - seen
    missing = sorted(f"{cls.__module__}.{cls.__qualname__}" for cls in seen - exported)
    assert missing == []

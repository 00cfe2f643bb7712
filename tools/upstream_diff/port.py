"""The port report: every upstream name the package patches, subclasses, overrides or imports at run time
(``adk/upstream.PORT_NAMES``), found in the base's sources and in 1.0.0a17's, with its signature in each and a
verdict (same, extended, changed, missing, now protobuf, not readable, present).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import NotRequired, TypedDict

from upstream_diff.pristine import PRIMARY_WHEELS, installed_site, primary_site, pristine
from upstream_diff.releases import PRIMARY, ROOT, SOURCE, SUPPORTED, base, python
from upstream_diff.series import apply_series
from upstream_diff.shell import run, say, scratch
from upstream_diff.signatures import compatible, describe


class PortName(TypedDict):
    """One of ``adk/upstream.PORT_NAMES``, as ``dataclasses.asdict`` gives it."""

    name: str
    use: str
    where: str
    successor: str


class PortRow(PortName):
    """A name's line of the report (``--json`` writes these)."""

    base: str | None  # its signature on the base; None: absent (or no base read)
    primary: str | None  # on 1.0.0a17
    status: str  # the verdict
    successor_primary: NotRequired[str | None]  # the successor's signature on 1.0.0a17, when the name has one


def port_names() -> list[PortName]:
    """adk/upstream.PORT_NAMES, read by the base's interpreter (the package needs its dependencies)."""
    code = (
        "import json, dataclasses; from kagent_memory_governed.adk.upstream import PORT_NAMES\n"
        "print(json.dumps([dataclasses.asdict(n) for n in PORT_NAMES]))"
    )
    names: list[PortName] = json.loads(run(python(), "-c", code, quiet=True, cwd=ROOT))
    return names


def verdict(before: str | None, after: str | None) -> str:
    """What became of a name between the base (``before``) and 1.0.0a17 (``after``), from their signatures."""
    if after is None:
        return "missing"
    if after.startswith("protobuf message "):
        return "now protobuf"
    if after.startswith("from "):
        return "not readable"
    if before is None:
        return "present"
    if before == after:
        return "same"
    return "extended" if compatible(before, after) else "changed"


def port_rows(base_roots: list[Path] | None, series_base: Path | None, primary_roots: list[Path]) -> list[PortRow]:
    """For each name: its signature on the base (None: absent) and on 1.0.0a17, and the verdict."""
    rows = []
    for entry in port_names():
        name, use = entry["name"], entry["use"]
        series_name = use == "series"
        before = None
        if base_roots is not None:
            roots = [series_base / SOURCE, *base_roots] if series_name and series_base else base_roots
            before = describe(roots, name)
        after_roots = [primary_roots[0] / SOURCE, *primary_roots[1:]] if series_name else primary_roots[1:]
        after = describe(after_roots, name)
        row = PortRow(
            name=name,
            use=use,
            where=entry["where"],
            successor=entry["successor"],
            base=before,
            primary=after,
            status=verdict(before, after),
        )
        if entry.get("successor"):
            row["successor_primary"] = describe(after_roots, entry["successor"])
        rows.append(row)
    return rows


def port_report(patched_base: Path | None, patched_primary: Path, *, fail_on_loss: bool) -> list[PortRow]:
    """Print the report; with ``fail_on_loss``, fail when the supported base lacks a name the package uses."""
    base_roots = [installed_site()] if patched_base is not None else None
    rows = port_rows(base_roots, patched_base, [patched_primary, primary_site()])
    label = f"kagent-adk {base()}" if base_roots else "the recorded names"
    say(f"\n== port report: {len(rows)} upstream names the package uses, on {label} and on {PRIMARY}")
    say("   (1.0 floors: " + ", ".join(f"{w.distribution} {w.version}" for w in PRIMARY_WHEELS) + ")")
    for row in rows:
        say(f"{row['status']:>12}  {row['use']:<10} {row['name']}")
        if row["status"] != "same":
            say(f"{'':>24}{base() if base_roots else 'base'}: {row['base']}")
            say(f"{'':>24}{PRIMARY}: {row['primary']}")
        if row.get("successor"):
            say(f"{'':>24}{PRIMARY} successor {row['successor']}: {row.get('successor_primary')}")
    say("   " + ", ".join(f"{count} {status}" for status, count in Counter(r["status"] for r in rows).most_common()))
    lost = [row["name"] for row in rows if base_roots is not None and row["base"] is None]
    if fail_on_loss and lost:
        raise SystemExit(f"upstream-diff: kagent-adk {base()} lacks names the package uses: {', '.join(lost)}")
    return rows


def report(json_path: str | None) -> None:
    """The port verb: the report on the base's patched sources (when the base is supported) and 1.0.0a17's, its
    rows also written to ``json_path`` when given."""
    version = base()
    patched_base = None
    if version in SUPPORTED:
        patched_base = scratch(f"upstream-diff-{version}-")
        pristine(patched_base, version)
        apply_series(patched_base, version, stat=False)
    primary = scratch(f"upstream-diff-{PRIMARY}-")
    pristine(primary, PRIMARY)
    apply_series(primary, PRIMARY, stat=False)
    rows = port_report(patched_base, primary, fail_on_loss=False)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1) + "\n")

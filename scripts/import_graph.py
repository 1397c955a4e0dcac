#!/usr/bin/env python3
"""Print the import graph between Tangram's layers (every ``import`` in the source, including
those inside functions), as edges with the number of modules that make them.

    python scripts/import_graph.py            # a table of layer -> layer edges
    python scripts/import_graph.py --modules  # which module imports which, across layers
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tangram"

#: Layer of a module, by its first package below ``tangram``: ``report`` (printing tables, no
#: Tangram import) at the bottom, then the pure ``core``, the ``trace`` vocabulary, the two
#: drivers ``sim`` and ``exec`` side by side, and the command line on top (``app``: ``cli``
#: and ``bench``). A layer may import its own and those below it, never a sibling or above.
LEVELS: dict[str, int] = {
    "report": 0,
    "clusters": 0,
    "core": 1,
    "trace": 2,
    "sim": 3,
    "exec": 3,
    "app": 4,
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "app"
    if name in ("bench", "cli", "__main__"):
        return "app"
    return name if name in LEVELS else "app"


def violations() -> list[tuple[str, str]]:
    """Module edges into a sibling layer or a layer above."""
    out = []
    for src, dst in module_edges():
        a, b = layer_of(src), layer_of(dst)
        if LEVELS[b] > LEVELS[a] or (LEVELS[b] == LEVELS[a] and a != b):
            out.append((src, dst))
    return out


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every ``tangram.*`` module this file imports, wherever the import statement is."""
    found = set()
    package = module_name(path).rsplit(".", 0 if path.name == "__init__.py" else 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tangram"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("tangram"):
                found.add(name)
    return found


def module_edges() -> list[tuple[str, str]]:
    """(importer, imported) for every import between different layers."""
    edges = []
    for path in sorted(ROOT.rglob("*.py")):
        src = module_name(path)
        for dst in sorted(imports_of(path)):
            if layer_of(src) != layer_of(dst):
                edges.append((src, dst))
    return edges


def layer_edges() -> Counter[tuple[str, str]]:
    """(importing layer, imported layer) -> number of importing modules."""
    seen = {(src, layer_of(dst)) for src, dst in module_edges()}
    return Counter((layer_of(src), dst) for src, dst in seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", action="store_true", help="list module-level edges")
    args = parser.parse_args()
    if args.modules:
        for src, dst in module_edges():
            print(f"{src} -> {dst}")
        return
    print("importing layer -> imported layer: modules")
    for (src, dst), n in sorted(layer_edges().items(), key=lambda e: (-LEVELS[e[0][0]], e[0])):
        print(f"  {src:>6} -> {dst:<6} {n}")
    bad = violations()
    print(f"edges into a sibling or a layer above: {len(bad)}")
    for src, dst in bad:
        print(f"  {src} -> {dst}")


if __name__ == "__main__":
    main()

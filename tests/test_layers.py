"""The import graph of ``src/spa``: no circles, and no arrow from a lower layer up to a higher one.

Every ``import`` counts, at any depth (inside functions, under ``TYPE_CHECKING``): a lazy
or type-only import still ties the two modules together, and it is how a circle usually
starts.
"""

import ast
from pathlib import Path

import spa

ROOT = Path(spa.__file__).parent

#: Bottom to top; a module may import from its own layer and the layers below it. A
#: module belongs to the layer of the longest name here that it starts with.
LAYERS = [
    ["spa", "spa.io", "spa.progress", "spa.precision", "spa.compute", "spa.heap", "spa.distributed",
     "spa.interrupt", "spa.config"],  # utilities with no knowledge of games, models or training
    ["spa.envs"],
    ["spa.models"],
    ["spa.agent"],  # prompts, parsing, rollouts: envs and the engine put together
    ["spa.eval"],
    ["spa.worldmodel"],  # self-play data and SFT, which score states and evaluate
    ["spa.rl"],
    ["spa.pipeline", "spa.demo"],
    ["spa.cli", "spa.__main__"],
]

#: Circles known and being removed. Each entry is the set of modules of one circle; a
#: circle passes while its modules are a subset of an entry. Delete an entry once its
#: circle is gone (test_allowances_are_still_needed says when). None today.
ALLOWED_CYCLES: list[set[str]] = []

#: Arrows up the layers known and being removed, as (importer, imported). None today.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module under ``root`` (src/spa) by dotted name (a package by its own name)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = ("spa", *path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules under ``root`` that it imports."""
    known = modules(root)
    graph = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: climb level - 1 packages from this one
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # `from spa.x import y` imports the module spa.x.y where there is one
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
        graph[name] = {t for t in targets if t in known and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while node not in component:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer(module: str) -> int | None:
    matches = [(len(prefix), rank) for rank, names in enumerate(LAYERS) for prefix in names
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


def describe(component: set[str], graph: dict[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in sorted(component) for b in sorted(graph[a] & component)]
    return "; ".join(edges)


def test_no_import_cycles():
    graph = import_graph()
    found = [c for c in cycles(graph) if not any(c <= allowed for allowed in ALLOWED_CYCLES)]
    assert not found, "import circles:\n" + "\n".join(describe(c, graph) for c in found)


def test_no_cycles_between_packages():
    graph = import_graph()
    package = {name: ".".join(name.split(".")[:2]) for name in graph}
    collapsed = {p: set() for p in package.values()}
    for name, targets in graph.items():
        collapsed[package[name]].update(package[t] for t in targets if package[t] != package[name])
    allowed = [{package[m] for m in c} for c in ALLOWED_CYCLES]
    found = [c for c in cycles(collapsed) if not any(c <= a for a in allowed)]
    assert not found, "packages that import each other:\n" + "\n".join(describe(c, collapsed) for c in found)


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer(m) is None] == [], "add these modules to LAYERS"


def test_no_import_runs_up_the_layers():
    graph = import_graph()
    upward = sorted((a, b) for a, targets in graph.items() for b in targets
                    if layer(b) is not None and layer(a) is not None and layer(b) > layer(a)
                    and (a, b) not in ALLOWED_UPWARD)
    assert not upward, "imports from a higher layer:\n" + "\n".join(
        f"{a} (layer {layer(a)}) -> {b} (layer {layer(b)})" for a, b in upward)


def test_allowances_are_still_needed():
    graph = import_graph()
    present = cycles(graph)
    stale = [sorted(a) for a in ALLOWED_CYCLES if not any(c <= a for c in present)]
    stale += [edge for edge in sorted(ALLOWED_UPWARD) if edge[1] not in graph.get(edge[0], set())]
    assert not stale, f"remove these from the allow-lists of tests/test_layers.py, they are fixed: {stale}"


def test_the_checks_see_circles_and_type_checking_imports(tmp_path):
    # A package of three modules: a -> b (under TYPE_CHECKING) -> a, and c -> a alone.
    package = tmp_path / "spa"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from spa.b import X\n")
    (package / "b.py").write_text("def f():\n    from . import a\n")
    (package / "c.py").write_text("import spa.a\n")
    graph = import_graph(package)
    assert graph == {"spa": set(), "spa.a": {"spa.b"}, "spa.b": {"spa.a"}, "spa.c": {"spa.a"}}
    assert cycles(graph) == [{"spa.a", "spa.b"}]

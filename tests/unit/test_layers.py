"""The package's floors stay true: layers import downward only, and no module imports itself round a circle.

The floors, bottom up (DESIGN.md's module map, README's "Layout"):

    workloads            the load generator; imports nothing of orchestrator
    orchestrator.values  the typed values every stage passes on (ground floor)
    orchestrator.infra   the run's own processes and ports
    orchestrator.plan    the sweep file, its expansion, model shapes, preflight
    orchestrator.node    on a GPU node: cores, the replica, telemetry       } side by side: neither
    orchestrator.observe summary, tracking, the report, the analyses          } imports the other
    orchestrator.control the controller, the Ray executor, the measurement sequence
    orchestrator         the command line and one sweep's wiring (cli, sweep)

Every import counts, function-local and ``TYPE_CHECKING`` ones included: a late import hides an arrow,
it does not remove it. Run as a script with a tree's root to see that tree's arrows:
``python tests/unit/test_layers.py PATH``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "workloads")

FLOORS: dict[str, int] = {
    "workloads": 0,
    "orchestrator.values": 1,
    "orchestrator.infra": 2,
    "orchestrator.plan": 3,
    "orchestrator.node": 4,
    "orchestrator.observe": 4,
    "orchestrator.control": 5,
    "orchestrator": 6,
}


def modules(root: Path) -> dict[str, Path]:
    """Every module of the packages under ``root``, by dotted name (a package by its own name)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The project modules that module ``name`` imports anywhere in its body (``from pkg import mod`` is an
    arrow to ``pkg.mod`` when that is a module, else to ``pkg``)."""
    known = set(known)
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import a.b.c` of a name inside a module: the module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    return {name: imports(name, path, mods) for name, path in mods.items()}


def floor_of(module: str) -> str:
    """The floor a module lives on: the longest :data:`FLOORS` prefix of its name."""
    best = ""
    for floor in FLOORS:
        if (module == floor or module.startswith(floor + ".")) and len(floor) > len(best):
            best = floor
    return best


def upward(edges: Mapping[str, Iterable[str]]) -> list[str]:
    """Every arrow that does not point to a lower floor (same floor excepted), as ``a -> b (floor x -> y)``."""
    bad = []
    for a, targets in sorted(edges.items()):
        fa = floor_of(a)
        for b in sorted(targets):
            fb = floor_of(b)
            if fa != fb and FLOORS[fb] >= FLOORS[fa]:
                bad.append(f"{a} -> {b} ({fa} -> {fb})")
    return bad


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


# ---------------------------------------------------------------- the tree itself

def test_every_module_lives_on_a_floor() -> None:
    assert [m for m in modules(ROOT) if floor_of(m) == ""] == []


def test_layers_import_downward_only() -> None:
    assert upward(graph(ROOT)) == []


def test_no_module_imports_itself_round_a_circle() -> None:
    assert cycles(graph(ROOT)) == []


def test_workloads_imports_nothing_of_the_orchestrator() -> None:
    assert [f"{a} -> {b}" for a, bs in graph(ROOT).items() if a.startswith("workloads")
            for b in bs if b.startswith("orchestrator")] == []


# ---------------------------------------------------------------- the checks catch what they are for

def test_an_upward_or_sideways_arrow_is_named() -> None:
    edges = {"orchestrator.node.replica": {"orchestrator.control.controller", "orchestrator.values.trial"},
             "orchestrator.observe.tracking": {"orchestrator.node.telemetry"},
             "orchestrator.plan.expand": {"orchestrator.values.trial"}}
    assert upward(edges) == [
        "orchestrator.node.replica -> orchestrator.control.controller (orchestrator.node -> orchestrator.control)",
        "orchestrator.observe.tracking -> orchestrator.node.telemetry (orchestrator.observe -> orchestrator.node)"]


def test_a_circle_is_found_also_through_a_third_module() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


def test_late_relative_and_from_package_imports_are_arrows(tmp_path: Path) -> None:
    pkg = tmp_path / "orchestrator"
    for sub in ("node", "control"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "control" / "lifeline.py").write_text("X = 1\n")
    (pkg / "node" / "replica.py").write_text(
        "def late():\n    from orchestrator.control import lifeline\n    from ..control.lifeline import X\n")
    (tmp_path / "workloads").mkdir()
    (tmp_path / "workloads" / "__init__.py").write_text("")
    assert graph(tmp_path)["orchestrator.node.replica"] == {"orchestrator.control.lifeline"}
    assert upward(graph(tmp_path)) == [
        "orchestrator.node.replica -> orchestrator.control.lifeline (orchestrator.node -> orchestrator.control)"]


if __name__ == "__main__":
    tree = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    edges = graph(tree)
    found = upward(edges)
    circles = cycles(edges)
    for line in found:
        print("upward:", line)
    for c in circles:
        print("circle:", " <-> ".join(c))
    print(f"{len(found)} upward arrows, {len(circles)} circles in {tree}")
    sys.exit(1 if found or circles else 0)

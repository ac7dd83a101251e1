"""The shape of the code: no import cycle among meshplan's modules, no module over
MAX_MODULE_LINES lines, and no function over MAX_FUNCTION_LINES lines in the core packages
(cost, search, specs and estimate.py).

What breaks a limit today is listed in KNOWN. The test asserts that the violations found are
exactly those: a new one fails it, and so does a listed one that is gone (take it off the list).

The import graph counts every import statement of a module, wherever it stands (inside a function
too: a lazy import still ties the two modules together), with relative imports resolved; an
imported name that is not a module counts as an import of its module, and a module's imports of
its own parent packages are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "meshplan"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
#: where functions are held to MAX_FUNCTION_LINES: paths relative to src/meshplan
CORE = ("cost/", "search/", "specs/", "estimate.py")

#: the violations that exist today, as (kind, where): ("module", path), ("function", "path:name")
#: or ("cycle", "a <-> b <-> ..."): none
KNOWN: set[tuple[str, str]] = set()


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__)."""
    out = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` (its file at ``path``) imports anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: level 1 is this package, 2 its parent, ...
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets += [base] + [f"{base}.{alias.name}" for alias in node.names]
    out = set()
    for target in targets:
        while target and target not in known:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != name and not name.startswith(target + "."):
            out.add(target)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> the modules it imports): its strongly connected
    components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def violations(src: Path = SRC) -> dict[tuple[str, str], str]:
    """Every broken limit as (kind, where) -> what was found."""
    known = modules(src)
    out: dict[tuple[str, str], str] = {}
    graph = {}
    for name, path in known.items():
        rel = path.relative_to(src / PACKAGE).as_posix()
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_MODULE_LINES:
            out[("module", rel)] = f"{lines} lines"
        if rel.startswith(CORE):
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        out[("function", f"{rel}:{node.name}")] = f"{length} lines"
        graph[name] = imported_modules(name, path, known)
    for component in cycles(graph):
        out[("cycle", " <-> ".join(component))] = f"{len(component)} modules"
    return out


def test_the_violations_are_exactly_the_known_ones():
    found = violations()
    new = {k: v for k, v in found.items() if k not in KNOWN}
    limits = f"module > {MAX_MODULE_LINES} lines, core function > {MAX_FUNCTION_LINES} lines, import cycle"
    assert not new, f"over the limits ({limits}): {new}"
    fixed = KNOWN - set(found)
    assert not fixed, f"no longer over the limits, take them off KNOWN: {sorted(fixed)}"


def test_the_import_graph_resolves_relative_and_lazy_imports(tmp_path):
    """The checker on a small package: a relative import, a lazy one inside a function and an
    imported name all make edges; an import of the own parent package does not."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from meshplan.sub import a\n")
    (pkg / "sub" / "a.py").write_text("from . import b\nfrom meshplan import sub\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..sub.a import g\n")
    (pkg / "c.py").write_text("import meshplan.sub.b\nfrom meshplan.sub.a import name_in_a\n")
    known = modules(tmp_path)
    graph = {name: imported_modules(name, path, known) for name, path in known.items()}
    assert graph == {
        "meshplan": set(),
        "meshplan.sub": {"meshplan.sub.a"},
        "meshplan.sub.a": {"meshplan.sub.b"},
        "meshplan.sub.b": {"meshplan.sub.a"},
        "meshplan.c": {"meshplan.sub.a", "meshplan.sub.b"},
    }
    assert cycles(graph) == [["meshplan.sub.a", "meshplan.sub.b"]]
    assert ("cycle", "meshplan.sub.a <-> meshplan.sub.b") in violations(tmp_path)

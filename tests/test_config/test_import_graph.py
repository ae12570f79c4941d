"""The floors of the whole package: every import runs down (or stays in its room), and nothing imports in a circle.

The graph is read from the source with ``ast``, function-local imports and
``importlib.import_module("echo_rl...")`` included (the approach of
``test_import_floor.py``): an import hidden in a function to dodge a circle is
still a circle. ``FLOORS`` is the house, ground floor first; a package may
import its own modules and packages on lower floors only. The measured figures
are the ones ``docs/architecture.md`` states, and a test keeps them equal.
"""

import ast
import re
from pathlib import Path

import echo_rl

PKG = Path(echo_rl.__file__).parent
DOC = PKG.parent / "docs" / "architecture.md"

# ground floor first; rooms on one floor do not import each other
FLOORS = (
    ("types", "config", "kernels"),
    ("utils", "plugins"),
    ("replay", "planning", "engine", "environments"),
    ("distributed", "models", "intrinsic"),
    ("algorithms", "serve"),
    ("training", "prompting"),
    ("vector",),
    ("lm",),
    ("core", "export", "evaluation", "experiments", "external"),
    ("hub",),
    ("commands",),
    ("cli", "agents", "hub.apps"),  # entry points and the promised echo_rl.agents re-export
)
FLOOR_OF = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def module_name(path: Path, root: Path = PKG) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(("echo_rl",) + (parts[:-1] if parts[-1] == "__init__" else parts))


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, dotted name, names taken from it) of every echo_rl import in ``source``."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{up}.{base}" if base else up
            found.append((node.lineno, base, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value, ()))
    return [f for f in found if f[1].startswith("echo_rl.")]


def room_of(module: str) -> str | None:
    """The floor room a module belongs to (``hub.apps`` before ``hub``); None for the root ``echo_rl``."""
    rest = module.split(".")[1:]
    for size in (2, 1):
        if len(rest) >= size and ".".join(rest[:size]) in FLOOR_OF:
            return ".".join(rest[:size])
    return rest[0] if rest else None


def module_graph(root: Path = PKG) -> dict[str, dict[str, list[int]]]:
    """module -> {imported echo_rl module: lines}; the root package (the public re-exports) is left out."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, dict[str, list[int]]] = {}
    for module, path in files.items():
        if module == "echo_rl":
            continue
        edges = graph.setdefault(module, {})
        for line, base, taken in imported_names(path.read_text(), module, path.name == "__init__.py"):
            submodules = [f"{base}.{name}" for name in taken if f"{base}.{name}" in files]
            names = submodules + ([base] if len(submodules) < len(taken) or not taken else [])
            for name in names:  # ``from X import y``: the module X.y where it is one, else X itself
                while name not in files and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name != module and name != "echo_rl":
                    edges.setdefault(name, []).append(line)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def measure(root: Path = PKG) -> dict:
    """The figures docs/architecture.md states, and the offending imports by name."""
    graph = module_graph(root)
    rooms = {room_of(m) for m in graph}
    room_edges: dict[str, set[str]] = {r: set() for r in rooms}
    upward = []
    for module, imports in graph.items():
        src = room_of(module)
        for name, lines in imports.items():
            dst = room_of(name)
            if dst is None or dst == src:
                continue
            room_edges[src].add(dst)
            if src in FLOOR_OF and dst in FLOOR_OF and FLOOR_OF[dst] >= FLOOR_OF[src]:
                upward += [f"{module}:{line} imports {name} ({src} may not import {dst})" for line in lines]
    # a package's own __init__ re-exporting its modules is the package, not a circle between its modules
    module_edges = {m: {n for n in imports if not m.startswith(n + ".") and not n.startswith(m + ".")}
                    for m, imports in graph.items()}
    return {"rooms": sorted(rooms), "packages": len(rooms), "edges": sum(map(len, room_edges.values())),
            "upward": sorted(upward), "package_circles": circles(room_edges), "module_circles": circles(module_edges)}


MEASURED = measure()


def test_every_package_has_a_floor():
    unplaced = sorted(set(MEASURED["rooms"]) - set(FLOOR_OF))
    assert not unplaced, f"packages missing from FLOORS (place each on its floor): {', '.join(unplaced)}"


def test_no_import_runs_back_up():
    assert not MEASURED["upward"], "imports running back up:\n" + "\n".join(MEASURED["upward"])


def test_no_circles_between_packages_or_modules():
    assert MEASURED["package_circles"] == [], MEASURED["package_circles"]
    assert MEASURED["module_circles"] == [], MEASURED["module_circles"]


def test_the_architecture_doc_states_the_measured_figures():
    text = DOC.read_text()
    found = re.search(r"(\d+) packages,\s+(\d+) imports\s+between\s+them,\s+(\d+) running\s+back\s+up,"
                      r"\s+(\d+) circles", text)
    assert found, "docs/architecture.md lost its 'N packages, N imports between them, ...' line"
    stated = tuple(map(int, found.groups()))
    circles_now = len(MEASURED["package_circles"]) + len(MEASURED["module_circles"])
    assert stated == (MEASURED["packages"], MEASURED["edges"], len(MEASURED["upward"]), circles_now)


def test_the_check_finds_upward_imports_and_circles(tmp_path):
    """A planted back-up import and a planted circle are found, whatever hides them (function, relative, importlib)."""
    root = tmp_path / "echo_rl"
    for room in ("config", "engine", "models"):
        (root / room).mkdir(parents=True)
        (root / room / "__init__.py").write_text("")
    (root / "__init__.py").write_text("from echo_rl.models import a\n")  # the root re-exports: left out
    (root / "config" / "base.py").write_text("def f():\n    import importlib\n"
                                             "    importlib.import_module('echo_rl.engine.b')\n")
    (root / "engine" / "b.py").write_text("from echo_rl.models import a\n")
    (root / "models" / "a.py").write_text("def g():\n    from ..engine import b\n")
    got = measure(root)
    assert got["packages"] == 3 and got["edges"] == 3
    assert got["upward"] == ["echo_rl.config.base:3 imports echo_rl.engine.b (config may not import engine)",
                             "echo_rl.engine.b:1 imports echo_rl.models.a (engine may not import models)"]
    assert got["package_circles"] == [["engine", "models"]]
    assert got["module_circles"] == [["echo_rl.engine.b", "echo_rl.models.a"]]


def test_hub_apps_is_its_own_room_above_commands():
    assert room_of("echo_rl.hub.apps.ppo_minigrid") == "hub.apps" and room_of("echo_rl.hub.models") == "hub"
    assert FLOOR_OF["hub.apps"] > FLOOR_OF["commands"] > FLOOR_OF["hub"]


def function_level_imports(root: Path = PKG) -> list[tuple[Path, int, str]]:
    """(file, line, its text) of every echo_rl import inside a function, with the comment that gives its reason
    (on its last line or the line above), or "" when it has none."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().split("\n")
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("echo_rl") and not node.level:
                    last, above = lines[node.end_lineno - 1], lines[node.lineno - 2].strip()
                    reason = last.split("#", 1)[1] if "#" in last else above[1:] if above.startswith("#") else ""
                    found.append((path, node.lineno, reason.strip()))
    return sorted(set(found))


def test_every_function_level_import_says_why():
    """An import inside a function defers a heavy or optional dependency, and says which, beside it."""
    silent = [f"{p.relative_to(PKG.parent)}:{line}" for p, line, reason in function_level_imports() if not reason]
    assert not silent, "function-level imports without their reason:\n" + "\n".join(silent)

"""The promised ``echo_rl.core.*`` paths are thin re-exports of the rooms that hold the code.

Three rules: each compatibility module re-exports objects defined in the rooms (its docstring names
its room; it defines nothing itself) and declares them in ``__all__``; no library module imports a compatibility module (they are for
users, so the rooms never depend on them); ``replay/`` and ``planning/`` import nothing of
echo_rl but the ground floor (``config``, ``types``, ``kernels``) and themselves. And the
experiment programs (``echo_rl/experiments/``) sit outside the library: nothing imports them.
"""

import ast
import importlib
from pathlib import Path

import pytest

import echo_rl

PKG = Path(echo_rl.__file__).parent

# promised path -> the room whose objects it re-exports
COMPAT = {
    "echo_rl.core.latent_planning": "echo_rl.planning",
    "echo_rl.core.prioritized_replay": "echo_rl.replay",
    "echo_rl.core.async_execution": "echo_rl.engine",
    "echo_rl.core.bandwidth": "echo_rl.training.bandwidth",  # and the engine's priority rule, engine.scheduler
}
PROMISED = {
    "echo_rl.core": {"PlanningConfig", "ExecutionConfig", "ReplayConfig", "PPOConfig", "BandwidthConfig"},
    "echo_rl.core.latent_planning": {"PlanningConfig", "TrajectoryEncoder", "PolicyNetwork",
                                     "LatentPlanningOptimizer"},
    "echo_rl.core.async_execution": {"ExecutionConfig", "AsyncExecutionEngine", "KVCacheManager"},
    "echo_rl.core.prioritized_replay": {"ReplayConfig", "PrioritizedReplayBuffer", "HotColdBuffer"},
    "echo_rl.core.bandwidth": {"BandwidthConfig", "BandwidthEfficiencyTracker", "BandwidthAwareScheduler"},
}
FLOOR = ("echo_rl.config", "echo_rl.types", "echo_rl.kernels")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute echo_rl import in the file, function-local ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [(node.lineno, node.module)]
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if node.module == "echo_rl"]
    return [(line, m) for line, m in out if m == "echo_rl" or m.startswith("echo_rl.")]


@pytest.mark.parametrize("module", sorted(PROMISED))
def test_promised_names_import(module):
    mod = importlib.import_module(module)
    missing = PROMISED[module] - set(dir(mod))
    assert not missing, f"{module} lost {sorted(missing)}"
    assert PROMISED[module] <= set(mod.__all__)


@pytest.mark.parametrize("module", sorted(COMPAT))
def test_compat_module_re_exports_its_rooms_objects(module):
    mod = importlib.import_module(module)
    room = COMPAT[module]
    assert room in mod.__doc__, f"{module}'s docstring must say the code lives in {room}"
    for name in mod.__all__:
        home = getattr(getattr(mod, name), "__module__", "")
        assert home.startswith("echo_rl.") and not home.startswith("echo_rl.core"), \
            f"{module}.{name} is defined in {home}, not in a room"
    defined = [n.name for n in ast.parse(Path(mod.__file__).read_text()).body
               if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    assert not defined, f"{module} defines {defined}: code belongs in {room}"


def test_no_library_module_imports_a_compat_path():
    bad = [f"{p.relative_to(PKG.parent)}:{line} imports {m}"
           for p in sorted(PKG.rglob("*.py")) if p.parent != PKG / "core"
           for line, m in imported_modules(p)
           if m == "echo_rl.core" or any(m == c or m.startswith(c + ".") for c in COMPAT)]
    assert not bad, "library code must import the rooms, not the compatibility paths:\n" + "\n".join(bad)


def test_no_library_module_imports_an_experiment():
    bad = [f"{p.relative_to(PKG.parent)}:{line} imports {m}"
           for p in sorted(PKG.rglob("*.py")) if PKG / "experiments" not in p.parents
           for line, m in imported_modules(p) if m == "echo_rl.experiments" or m.startswith("echo_rl.experiments.")]
    assert not bad, "experiments are programs over the library, not part of it:\n" + "\n".join(bad)


@pytest.mark.parametrize("room", ["replay", "planning"])
def test_room_imports_only_the_ground_floor_and_itself(room):
    allowed = (*FLOOR, f"echo_rl.{room}")
    files = sorted((PKG / room).glob("*.py"))
    assert files
    bad = [f"{p.relative_to(PKG.parent)}:{line} imports {m}" for p in files for line, m in imported_modules(p)
           if not any(m == a or m.startswith(a + ".") for a in allowed)]
    assert not bad, f"echo_rl/{room} imports above its floor:\n" + "\n".join(bad)


def test_the_checks_see_what_they_guard(tmp_path):
    """The import reader finds local and ``from echo_rl import core`` imports (so the rules can fail)."""
    f = tmp_path / "m.py"
    f.write_text("from echo_rl import core\ndef g():\n    from echo_rl.core.latent_planning import X\n"
                 "import echo_rl.replay.buffer\nfrom . import sibling\n")
    assert sorted(imported_modules(f)) == [(1, "echo_rl"), (1, "echo_rl.core"), (3, "echo_rl.core.latent_planning"),
                                           (4, "echo_rl.replay.buffer")]

"""The ground floor (config/, types.py, kernels/) imports nothing of echo_rl above it.

The imports are read from the source (ast), so a function-local ``import`` or an
``importlib.import_module("echo_rl...")`` counts as much as a top-level one:
those are what closed the old config -> registries -> config import circle.
"""

import ast
from pathlib import Path

import pytest

import echo_rl
from echo_rl import ConfigError, TrainingConfig
from echo_rl import config as config_module
from echo_rl.config import names as name_rules_module

PKG = Path(echo_rl.__file__).parent

# floor -> (its files, the echo_rl modules it may import: itself only)
FLOORS = {
    "config": (sorted((PKG / "config").glob("*.py")), ("echo_rl.config",)),
    "types": ([PKG / "types.py"], ()),
    "kernels": (sorted((PKG / "kernels").glob("*.py")), ("echo_rl.kernels",)),
}


def echo_rl_imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, module) of every echo_rl import in ``source`` (``module``: its dotted name, for relative imports)."""
    found = []
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names = [f"{base}.{node.module}" if node.module else base]
            else:
                names = [node.module or ""]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        found += [(node.lineno, n) for n in names if n == "echo_rl" or n.startswith("echo_rl.")]
    return found


def violations_in(source: str, module: str, allowed: tuple[str, ...]) -> list[str]:
    return [f"line {line} imports {name}" for line, name in sorted(echo_rl_imports(source, module))
            if not any(name == a or name.startswith(a + ".") for a in allowed)]


def violations(path: Path, allowed: tuple[str, ...]) -> list[str]:
    module = "echo_rl." + ".".join(path.relative_to(PKG).with_suffix("").parts)
    return [f"{path.relative_to(PKG.parent)}: {v}" for v in violations_in(path.read_text(), module, allowed)]


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_ground_floor_imports_nothing_above_it(floor):
    files, allowed = FLOORS[floor]
    assert files, f"no files for floor {floor}"
    bad = [v for f in files for v in violations(f, allowed)]
    assert not bad, "ground floor imports an upper floor:\n" + "\n".join(bad)


def test_the_check_sees_local_relative_and_importlib_imports():
    source = ("import os\nfrom echo_rl.kernels import sumtree\n"
              "def f():\n    from echo_rl.training import agents\n"
              "def g():\n    from ..models import api\n    from . import sampling\n"
              "def h():\n    importlib.import_module('echo_rl.environments.registry')\n")
    assert sorted(echo_rl_imports(source, "echo_rl.kernels.sampling")) == [
        (2, "echo_rl.kernels"), (4, "echo_rl.training"), (6, "echo_rl.models"), (7, "echo_rl.kernels"),
        (9, "echo_rl.environments.registry")]
    assert violations_in(source, "echo_rl.kernels.sampling", ("echo_rl.kernels",)) == [
        "line 4 imports echo_rl.training", "line 6 imports echo_rl.models",
        "line 9 imports echo_rl.environments.registry"]


def test_the_config_floor_is_every_config_module():
    """A module added to the config package is checked too, and the old single file is gone."""
    files = {p.name for p in FLOORS["config"][0]}
    assert {"__init__.py", "base.py", "components.py", "names.py", "training.py"} <= files
    assert not (PKG / "config.py").exists()


def test_echo_rl_config_still_exports_every_name():
    expected = {"AUGMENTATION_NAMES", "BandwidthConfig", "ConfigBase", "ConfigError", "ENCODER_NAMES",
                "EchoAgentConfig", "ExecutionConfig", "LMConfig", "NAME_RULES", "PPOConfig", "PlanningConfig",
                "ReplayConfig", "TrainingConfig", "name_rule", "parse_override", "register_name_rule", "spec"}
    assert expected <= set(config_module.__all__)
    assert all(hasattr(config_module, name) for name in expected)
    assert config_module._name_rules is name_rules_module._name_rules


def test_every_name_rule_is_registered_by_import_echo_rl():
    assert set(config_module._name_rules) == set(config_module.NAME_RULES)


def test_a_missing_rule_is_a_clear_error_not_a_skipped_check(monkeypatch):
    monkeypatch.setattr(name_rules_module, "_name_rules", {})
    with pytest.raises(RuntimeError, match="no 'task' name rule is registered .*echo_rl.environments.registry"):
        TrainingConfig()


def test_register_name_rule_refuses_unknown_rules_and_non_callables():
    with pytest.raises(ValueError, match="unknown name rule 'tasks'; allowed: task, vector_task, agent"):
        config_module.register_name_rule("tasks", lambda name: None)
    with pytest.raises(TypeError, match="name rule 'task' must be callable, got str"):
        config_module.register_name_rule("task", "check_task_name")


def test_a_registered_rule_is_what_validates(monkeypatch):
    """The owner's rule decides: a replaced agent rule accepts/refuses what the new owner says."""
    def only_this(name):
        if name != "only-this":
            raise ConfigError(f"unknown agent {name!r}; allowed: only-this")

    monkeypatch.setitem(config_module._name_rules, "agent", only_this)
    with pytest.raises(ConfigError, match="unknown agent 'ppo'; allowed: only-this"):
        TrainingConfig(agent="ppo")


@pytest.mark.parametrize("kwargs, needle", [
    ({"env_name": "nethack"}, "unknown task 'nethack'"),
    ({"env_name": "minigrid:MiniGrid-Nope-v0"}, "unknown MiniGrid env id 'MiniGrid-Nope-v0'"),
    ({"agent": "sac"}, "unknown agent 'sac'; allowed: dqn, echo-rl, impala, ppo"),
    ({"loggers": ["tensorbored"]}, "TrainingConfig.loggers has 'tensorbored': allowed: tensorboard"),
    ({"env_name": "alfworld", "backbone": "gpt-4o"}, "TrainingConfig.backbone='gpt-4o' is invalid: an API model"),
])
def test_names_are_still_checked_on_construction(kwargs, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        TrainingConfig(**kwargs)
    assert "\n" not in str(err.value)

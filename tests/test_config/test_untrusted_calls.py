"""Every call in echo_rl/ that could unpickle, execute or import bytes is listed with its guard.

The calls are found by ``ast`` (function-local imports and aliases included), so a new
``pickle.loads`` / ``torch.load`` / ``torch.jit.load`` / ``np.load`` / yaml load / ``from_pretrained`` /
``exec`` / ``import_module`` fails here until it is added to ``ALLOWED`` with its guard — and the guards
that can be read from the call (``weights_only=True``, ``allow_pickle=False``, ``trust_remote_code=False``,
a safe YAML loader) are checked, not trusted. docs/architecture.md, "Untrusted input", is the same list.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import echo_rl

PKG = Path(echo_rl.__file__).parent
DOC = PKG.parent / "docs" / "architecture.md"

# checked guards: the call itself carries them
WEIGHTS_ONLY, NO_PICKLE, NO_REMOTE_CODE, SAFE_YAML = "weights_only=True", "allow_pickle=False", \
    "trust_remote_code=False", "yaml safe loader"
# stated guards: why the call reads no untrusted bytes (reviewed; tested by their own tests)
SIGNED = "Signed bytes only (this process's own pickle, or a checkpoint signed with the user's run key)"
OWN_CHILD = "bytes from a child process this one spawned (IPC), never from a file"
FROM_DRIVER = "bytes from the Ray driver, which passes only Signed ones (check_ray_rollout_state)"
OPT_IN = "explicit opt-in: load_policy(path, allow_code=True)"
SANDBOX = "runs in the sandbox worker (bwrap), by design"
REGISTERED = "module names from echo_rl's own code/registries, never from a run directory"
USER_PLUGIN = "module names the user passes (--plugin, $ECHO_RL_PLUGINS, installed entry points)"

# (file, enclosing function, call) -> (guard, how many such calls)
ALLOWED: dict[tuple[str, str, str], tuple[str, int]] = {
    ("utils/state_codec.py", "loads", "pickle.loads"): (SIGNED, 1),
    ("utils/state_codec.py", "read", "np.load"): (NO_PICKLE, 1),
    ("utils/state_codec.py", "_Decoder.decode", "importlib.import_module"): (REGISTERED, 1),
    ("training/run_dir.py", "RunDirectory.load_checkpoint", "torch.load"): (WEIGHTS_ONLY, 1),
    ("lm/loop.py", "LMAgent._sft", "torch.load"): (WEIGHTS_ONLY, 1),
    ("replay/persistence.py", "load_buffer", "np.load"): (NO_PICKLE, 1),
    ("vector/actor_process.py", "_serve", "pickle.loads"): (OWN_CHILD, 1),
    ("vector/actor_process.py", "ProcessActor.__init__", "pickle.loads"): (OWN_CHILD, 1),
    ("vector/actor_process.py", "ProcessActor.sync_state", "pickle.loads"): (OWN_CHILD, 1),
    ("distributed/data_parallel.py", "run_learners", "pickle.loads"): (OWN_CHILD, 1),
    ("vector/ray_backend.py", "RolloutWorker.load_rollout_state", "pickle.loads"): (FROM_DRIVER, 1),
    ("vector/ray_offpolicy.py", "DQNWorker.load_rollout_state", "pickle.loads"): (FROM_DRIVER, 1),
    ("export/loading.py", "TorchBackend.__init__", "torch.jit.load"): (OPT_IN, 1),
    ("models/local.py", "LocalBackbone.__init__", "transformers.AutoTokenizer.from_pretrained"): (NO_REMOTE_CODE, 1),
    ("models/local.py", "LocalBackbone.__init__", "transformers.AutoModelForCausalLM.from_pretrained"):
        (NO_REMOTE_CODE, 1),
    ("lm/policy.py", "load_policy", "transformers.AutoTokenizer.from_pretrained"): (NO_REMOTE_CODE, 1),
    ("lm/policy.py", "load_policy", "transformers.AutoModelForCausalLM.from_pretrained"):
        (NO_REMOTE_CODE, 1),
    ("models/fetch.py", "convert_gguf", "transformers.AutoTokenizer.from_pretrained"): (NO_REMOTE_CODE, 1),
    ("models/fetch.py", "convert_gguf", "transformers.AutoModelForCausalLM.from_pretrained"): (NO_REMOTE_CODE, 2),
    ("models/fetch.py", "convert_gguf", "transformers.AutoModelForCausalLM.from_config"): (NO_REMOTE_CODE, 1),
    ("environments/_sandbox_worker.py", "_child", "exec"): (SANDBOX, 1),
    ("environments/_sandbox_worker.py", "_child", "eval"): (SANDBOX, 1),
    ("environments/_sandbox_worker.py", "_child", "compile"): (SANDBOX, 2),
    ("environments/_sandbox_worker.py", "main", "__import__"): (SANDBOX, 1),
    ("__init__.py", "__getattr__", "importlib.import_module"): (REGISTERED, 1),
    ("cli.py", "_command_modules", "importlib.import_module"): (REGISTERED, 1),
    ("kernels/_backend.py", "", "importlib.import_module"): (REGISTERED, 1),
    ("environments/registry.py", "_load_builtins", "importlib.import_module"): (REGISTERED, 1),
    ("utils/optional.py", "require", "importlib.import_module"): (REGISTERED, 1),
    ("utils/optional.py", "load_attr", "importlib.import_module"): (REGISTERED, 1),
    ("config/base.py", "load_yaml_text", "yaml.load"): (SAFE_YAML, 1),
    ("commands/replay_server.py", "run", "__import__"): (REGISTERED, 1),
    ("plugins.py", "load_plugins", "importlib.import_module"): (USER_PLUGIN, 1),
}

PICKLE_MODULES = {"pickle", "_pickle", "cloudpickle", "dill", "joblib", "marshal", "shelve"}
LOADERS = {"load", "loads", "Unpickler", "open"}
YAML_LOADERS = {"load", "load_all", "safe_load", "safe_load_all", "full_load", "full_load_all", "unsafe_load",
                "unsafe_load_all"}
# names whose import (``from pickle import loads``, ``import torch.jit as j``) would hide a call from this scan
RISKY_MODULES = PICKLE_MODULES | {"yaml", "torch", "torch.jit", "numpy", "transformers", "peft", "importlib"}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else f"?.{node.attr}"
    return None


def _kind(name: str) -> str | None:
    """The kind of risky call ``name`` is, or None."""
    parts = name.split(".")
    head, last = parts[0], parts[-1]
    if head in PICKLE_MODULES and last in LOADERS:
        return "pickle"
    if name in ("torch.load", "torch.jit.load", "jit.load", "torch.package.PackageImporter"):
        return "torch"
    if head in ("np", "numpy") and last == "load":
        return "numpy"
    if head == "yaml" and last in YAML_LOADERS:
        return "yaml"
    if last == "from_pretrained" or (last == "from_config" and ("transformers" in name or "Auto" in name)):
        return "transformers"
    if name in ("exec", "eval", "compile", "__import__", "importlib.import_module", "runpy.run_path",
                "runpy.run_module", "importlib.util.spec_from_file_location"):
        return "code"
    return None


def _guard_holds(guard: str, call: ast.Call, name: str) -> bool:
    kw = {k.arg: k.value for k in call.keywords if k.arg}

    def literal(key, value):
        return isinstance(kw.get(key), ast.Constant) and kw[key].value is value

    if guard == WEIGHTS_ONLY:
        return literal("weights_only", True)
    if guard == NO_PICKLE:
        return literal("allow_pickle", False)
    if guard == NO_REMOTE_CODE:
        return literal("trust_remote_code", False)
    if guard == SAFE_YAML:
        loader = _dotted(kw["Loader"]) if "Loader" in kw else ""
        return name.split(".")[-1].startswith("safe_load") or "Safe" in (loader or "")
    return True  # a stated guard: the entry in ALLOWED is the review


def scan(source: str, path: str) -> tuple[Counter, list[str]]:
    """(calls by (path, scope, name), problems that need no allow-list to be wrong: hiding imports)."""
    found: Counter = Counter()
    calls: list[tuple[tuple[str, str, str], ast.Call]] = []
    problems: list[str] = []
    scope: list[str] = []

    class Visitor(ast.NodeVisitor):
        def _scoped(self, node):
            scope.append(node.name)
            self.generic_visit(node)
            scope.pop()

        visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

        def visit_Import(self, node):
            for alias in node.names:
                if alias.name in RISKY_MODULES and alias.asname and alias.asname != alias.name.split(".")[-1] \
                        and (alias.name, alias.asname) != ("numpy", "np"):
                    problems.append(f"{path}:{node.lineno} imports {alias.name} as {alias.asname}")

        def visit_ImportFrom(self, node):
            if node.module in RISKY_MODULES:
                for alias in node.names:
                    if _kind(f"{node.module}.{alias.name}") or alias.name in ("jit", "import_module"):
                        problems.append(f"{path}:{node.lineno} imports {alias.name} from {node.module}")

        def visit_Call(self, node):
            name = _dotted(node.func)
            if name and _kind(name):
                key = (path, ".".join(s for s in scope if not s.startswith("<")), name)
                found[key] += 1
                calls.append((key, node))
            self.generic_visit(node)

    Visitor().visit(ast.parse(source))
    for key, call in calls:
        allowed = ALLOWED.get(key)
        if allowed is not None and not _guard_holds(allowed[0], call, key[2]):
            problems.append(f"{key[0]}:{call.lineno} {key[2]} in {key[1] or 'module level'} lacks its guard "
                            f"{allowed[0]}")
    return found, problems


def test_every_risky_call_is_listed_with_its_guard():
    found: Counter = Counter()
    problems: list[str] = []
    for file in sorted(PKG.rglob("*.py")):
        got, bad = scan(file.read_text(), file.relative_to(PKG).as_posix())
        found.update(got)
        problems += bad
    for key, n in sorted(found.items()):
        if key not in ALLOWED:
            problems.append(f"{key[0]}: {key[2]} in {key[1] or 'module level'} is not in ALLOWED: guard it (signed, "
                            f"weights_only=True, allow_pickle=False, safe YAML loader, trust_remote_code=False or an "
                            f"explicit opt-in) and list it here and in docs/architecture.md")
        elif ALLOWED[key][1] != n:
            problems.append(f"{key[0]}: {n} calls of {key[2]} in {key[1]}, ALLOWED lists {ALLOWED[key][1]}")
    problems += [f"{key} is listed but gone: remove it" for key in ALLOWED if key not in found]
    assert not problems, "\n".join(problems)


def test_the_scan_catches_unguarded_and_hidden_calls():
    source = '''
import pickle, torch, yaml
from pickle import loads as l
import numpy as np
def restore(path):
    torch.load(path)
    torch.load(path, weights_only=False)
    np.load(path, allow_pickle=True)
    yaml.load(open(path), Loader=yaml.Loader)
    pickle.loads(b"")
    AutoModel.from_pretrained(path)
'''
    found, problems = scan(source, "x.py")
    assert found == Counter({("x.py", "restore", "torch.load"): 2, ("x.py", "restore", "np.load"): 1,
                             ("x.py", "restore", "yaml.load"): 1, ("x.py", "restore", "pickle.loads"): 1,
                             ("x.py", "restore", "AutoModel.from_pretrained"): 1})
    assert any("imports loads from pickle" in p for p in problems)
    # a listed call that drops its guard is caught too
    listed = 'class RunDirectory:\n    def load_checkpoint(path):\n        torch.load(path, weights_only=False)\n'
    _, problems = scan(listed, "training/run_dir.py")
    assert problems == ["training/run_dir.py:3 torch.load in RunDirectory.load_checkpoint lacks its guard "
                        "weights_only=True"]
    fp = 'def load_policy(p):\n    transformers.AutoTokenizer.from_pretrained(p, local_files_only=True)\n'
    assert "lacks its guard trust_remote_code=False" in scan(fp, "lm/policy.py")[1][0]


def test_the_docs_list_every_file_with_a_risky_call():
    section = DOC.read_text().split("## Untrusted input", 1)
    assert len(section) == 2, "docs/architecture.md has no '## Untrusted input' section"
    text = section[1].split("\n## ", 1)[0]
    missing = sorted({path for path, _, _ in ALLOWED if f"`{path}`" not in text})
    assert not missing, f"docs/architecture.md 'Untrusted input' does not name {missing}"

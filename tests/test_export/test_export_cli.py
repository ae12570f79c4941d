"""`echo-rl export` and the standalone script: happy paths, and bad input as one line with exit code 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime", reason="ONNX export needs pip install 'echo-rl[export]'")

from echo_rl.cli import main  # noqa: E402
from echo_rl.config import ConfigError  # noqa: E402
from echo_rl.export.loading import load_policy  # noqa: E402
from echo_rl.hub.models import evaluate_greedy  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV = "minigrid:MiniGrid-DoorKey-5x5-v0"


def _one_line_error(capsys, needle):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("fmt", ["onnx", "safetensors"])
def test_export_command_writes_and_checks_parity(ppo_run, tmp_path, capsys, fmt):
    out = tmp_path / f"cli.{fmt}"
    assert main(["export", "--run-dir", str(ppo_run), "--format", fmt, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"exported: {out}" in text and "greedy actions agree 100.0%" in text
    assert load_policy(out).meta["checkpoint"].startswith("step_")


@pytest.mark.parametrize("args, needle", [
    (["--format", "tflite"], "--format 'tflite' is invalid: allowed: onnx, safetensors"),
    (["--format", "safetensors", "--quantize", "int8"], "--quantize int8 applies to --format onnx"),
    (["--format", "onnx", "--quantize", "int4"], "--quantize 'int4' is invalid: allowed: int8"),
    (["--format", "transformers"], "is a vector-policy run"),
])
def test_bad_format_is_one_line(ppo_run, args, needle, capsys):
    assert main(["export", "--run-dir", str(ppo_run), *args]) == 2
    _one_line_error(capsys, needle)


def test_bad_runs_are_one_line(ppo_run, tmp_path, capsys):
    from echo_rl.config import TrainingConfig

    assert main(["export", "--run-dir", str(tmp_path / "missing")]) == 2
    _one_line_error(capsys, "no such run directory")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    TrainingConfig(env_name=ENV).save_yaml(fresh / "config.yaml")
    assert main(["export", "--run-dir", str(fresh)]) == 2
    _one_line_error(capsys, "the run is not trained yet")
    # a damaged checkpoint: every kept one is garbage
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(ppo_run, broken)
    for state in (broken / "checkpoints").glob("step_*/state.pt"):
        state.write_bytes(b"not a checkpoint")
    assert main(["export", "--run-dir", str(broken)]) == 2
    _one_line_error(capsys, "state.pt is unreadable")


def test_corrupt_and_foreign_files_are_config_errors(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x01garbage")
    with pytest.raises(ConfigError, match="not a loadable ONNX model"):
        load_policy(bad)
    pt = tmp_path / "weights.pt"
    import torch

    torch.save({"w": torch.zeros(2)}, pt)  # a plain state dict, not a TorchScript export
    with pytest.raises(ConfigError, match="is TorchScript: a program"):  # a zip archive: refused before reading
        load_policy(pt)
    with pytest.raises(ConfigError, match="not a loadable TorchScript policy|has no echo_rl.json"):
        load_policy(pt, allow_code=True)
    st = tmp_path / "foreign.safetensors"
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(st))  # tensors, but not an echo-rl export
    with pytest.raises(ConfigError, match="has no 'echo_rl' metadata with a config"):
        load_policy(st)
    st.write_bytes(st.read_bytes()[:-4])  # the header intact, the data cut short
    with pytest.raises(ConfigError, match="not a loadable safetensors policy"):
        load_policy(st)
    with pytest.raises(ConfigError, match="'hub:no-such-model' is neither a run directory nor an exported "
                                          ".onnx/.safetensors"):
        load_policy("hub:no-such-model")  # export knows files; hub names are the hub's


def test_echo_rl_load_policy_adds_hub_names(tmp_path):
    import echo_rl
    from echo_rl.hub import models

    assert echo_rl.load_policy is models.load_policy
    with pytest.raises(ConfigError, match="unknown hub model 'no-such-model'; allowed: "):
        echo_rl.load_policy("hub:no-such-model")
    with pytest.raises(ConfigError, match="neither a run directory, an exported .onnx/.safetensors file nor a hub "
                                          "model; hub models: "):
        echo_rl.load_policy(tmp_path / "nowhere")


@pytest.mark.parametrize("which", ["ppo_run", "echo_run"])
def test_standalone_script_matches_load_policy(which, request, tmp_path):
    """examples/standalone_policy.py (numpy + onnxruntime + minigrid, no echo_rl) runs the episodes echo_rl's
    evaluation runs, with the same greedy actions (for the EchoRL agent, from the same plan windows): same
    success and the same returns."""
    run = request.getfixturevalue(which)
    out = tmp_path / "standalone.onnx"
    assert main(["export", "--run-dir", str(run), "--out", str(out), "--no-check"]) == 0
    episodes, seed, num_envs = 6, 1_000_003, 3
    script = subprocess.run([sys.executable, "-I", str(ROOT / "examples" / "standalone_policy.py"), str(out),
                             str(episodes), str(seed), str(num_envs)], capture_output=True, text=True, timeout=300)
    assert script.returncode == 0, script.stderr[-2000:]
    got = json.loads(script.stdout)
    from echo_rl.export.runs import run_config

    want = evaluate_greedy(load_policy(run), ENV, episodes, seed, num_envs, run_config(run).env_config)
    assert got["episodes"] == want["episodes"] == episodes
    assert got["success_rate"] == want["success_rate"]
    assert got["avg_reward"] == pytest.approx(want["avg_reward"], abs=1e-12)


def test_standalone_script_imports_no_echo_rl():
    import ast

    source = (ROOT / "examples" / "standalone_policy.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported == {"json", "re", "sys", "gymnasium", "minigrid", "numpy", "onnxruntime"}
    assert len(source.splitlines()) <= 45


def test_runs_export_cannot_write_are_refused_in_one_line(train_run, tmp_path, capsys):
    """A continuous-action policy (logits are not its actions) and a DQN run (no exporter) fail in one line."""
    box = train_run(tmp_path / "pendulum", "ppo", env_name="Pendulum-v1", total_timesteps=256, batch_size=256,
                    env_config={})
    assert main(["export", "--run-dir", str(box), "--out", str(tmp_path / "p.onnx")]) == 2
    _one_line_error(capsys, "acts in a continuous (Box) action space")
    dqn = tmp_path / "dqn"
    from echo_rl.config import TrainingConfig

    dqn.mkdir()
    TrainingConfig(env_name=ENV, agent="dqn").save_yaml(dqn / "config.yaml")
    assert main(["export", "--run-dir", str(dqn)]) == 2
    _one_line_error(capsys, "agent 'dqn' cannot be exported yet")
    assert not (tmp_path / "p.onnx").exists()

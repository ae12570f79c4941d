"""Hub policies load by name and reach their published success, in echo_rl and in the standalone script."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime", reason="hub models are ONNX: pip install 'echo-rl[export]'")

from echo_rl.config import ConfigError  # noqa: E402
from echo_rl.hub import models  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["ppo-doorkey-5x5", "ppo-multiroom-n2-s4"])
def test_hub_model_reaches_its_published_success_by_name(name):
    assert name in models.names()
    entry = models.info(name)
    pub = entry["published"]
    assert pub["episodes"] == 100 and pub["actions"] == "greedy"
    got = models.evaluate(name)  # load_policy("hub:ppo-doorkey-5x5") on the published episodes
    assert got["success_rate"] == pub["success_rate"] and got["avg_reward"] == pytest.approx(pub["avg_reward"])
    # the trained run's own (sampled) evaluation and its PyTorch greedy evaluation agree with the file
    assert pub["success_rate"] >= entry["run_evaluation"]["success_rate"] - 0.05
    assert entry["pytorch_greedy"]["success_rate"] == pub["success_rate"]
    assert pub["success_rate"] >= 0.9


@pytest.mark.parametrize("name", ["ppo-doorkey-5x5"])
def test_standalone_script_reaches_the_published_success(name):
    entry = models.info(name)
    pub = entry["published"]
    r = subprocess.run([sys.executable, "-I", str(ROOT / "examples" / "standalone_policy.py"),
                        str(models.path(name)), str(pub["episodes"]), str(pub["seed"]),
                        str(pub["num_envs"])], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["success_rate"] == pub["success_rate"]
    assert got["avg_reward"] == pytest.approx(pub["avg_reward"], abs=1e-9)


def test_a_damaged_or_unknown_model_is_one_clear_error(tmp_path, monkeypatch):
    shutil.copytree(models.models_dir(), tmp_path / "models")
    (tmp_path / "models" / "ppo-doorkey-5x5.onnx").write_bytes(b"\x00" * 64)
    monkeypatch.setattr(models, "models_dir", lambda: tmp_path / "models")
    models._index.cache_clear()
    try:
        with pytest.raises(ConfigError, match="does not match its recorded SHA-256"):
            models.path("ppo-doorkey-5x5")
        with pytest.raises(ConfigError, match="unknown hub model 'nope'; allowed: ppo-doorkey-5x5, ppo-multiroom"):
            models.info("nope")
    finally:
        models._index.cache_clear()


def test_build_models_refuses_unknown_names(capsys):
    from echo_rl.hub.build_models import main

    assert main(["ppo-nowhere"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "allowed: ppo-doorkey-5x5, ppo-multiroom-n2-s4" in err


def test_standalone_sampling_reaches_the_runs_own_evaluation():
    """`sample` mode draws from the exported policy as the run's evaluation did (other draws, same law)."""
    entry = models.info("ppo-doorkey-5x5")
    pub, own = entry["published"], entry["run_evaluation"]
    r = subprocess.run([sys.executable, "-I", str(ROOT / "examples" / "standalone_policy.py"),
                        str(models.path("ppo-doorkey-5x5")), str(pub["episodes"]), str(pub["seed"]),
                        str(pub["num_envs"]), "sample"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert abs(got["success_rate"] - own["success_rate"]) <= 0.05
    assert abs(got["avg_reward"] - own["avg_reward"]) <= 0.05

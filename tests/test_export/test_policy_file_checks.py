"""A policy file or name from elsewhere: malformed metadata is one clear line, and ``hub:NAME`` is only the hub."""

import json

import pytest

pytest.importorskip("onnxruntime", reason="hub models are ONNX: pip install 'echo-rl[export]'")
onnx = pytest.importorskip("onnx", reason="pip install 'echo-rl[export]'")

from echo_rl import load_policy  # noqa: E402
from echo_rl.config import ConfigError  # noqa: E402
from echo_rl.export.vector import META_KEY  # noqa: E402
from echo_rl.hub import models  # noqa: E402

HUB = "ppo-doorkey-5x5"


def test_a_local_folder_named_like_a_hub_model_never_shadows_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"hub:{HUB}" / "checkpoints").mkdir(parents=True)  # the old code loaded this folder instead
    (tmp_path / f"hub:{HUB}" / "config.yaml").write_text("env_name: minigrid\n")
    (tmp_path / "hub:nope").mkdir()
    policy = load_policy(f"hub:{HUB}")
    assert policy.source == f"hub:{HUB}" and policy.meta["env_name"] == models.info(HUB)["env_name"]
    with pytest.raises(ConfigError, match="unknown hub model 'nope'; allowed: "):
        load_policy("hub:nope")  # the local folder hub:nope is not looked at


def _with_meta(tmp_path, raw: str):
    model = onnx.load(str(models.path(HUB)))
    for prop in model.metadata_props:
        if prop.key == META_KEY:
            prop.value = raw
    out = tmp_path / "policy.onnx"
    onnx.save(model, str(out))
    return out


def _meta():
    model = onnx.load(str(models.path(HUB)))
    return json.loads(next(p.value for p in model.metadata_props if p.key == META_KEY))


@pytest.mark.parametrize("raw, needle", [
    ("{not json", "not JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    (json.dumps({k: v for k, v in _meta().items() if k != "inputs"}), "'inputs' is missing"),
    (json.dumps({**_meta(), "obs_dim": "148"}), "'obs_dim' is '148', expected int"),
    (json.dumps({**_meta(), "obs_shape": [2, 2]}), "does not match obs_dim"),
    (json.dumps({**_meta(), "obs_dtype": "object"}), "not a numeric dtype"),
    (json.dumps({**_meta(), "obs_encoding": {"mission_vocab": 3}}), "obs_encoding is not"),
])
def test_malformed_policy_metadata_is_one_line(tmp_path, raw, needle):
    with pytest.raises(ConfigError) as err:
        load_policy(_with_meta(tmp_path, raw))
    assert needle in str(err.value) and "\n" not in str(err.value) and "malformed 'echo_rl' metadata" in str(err.value)


def test_well_formed_metadata_still_loads(tmp_path):
    policy = load_policy(_with_meta(tmp_path, json.dumps(_meta())))
    assert policy.meta == _meta()


def test_export_into_a_run_whose_export_folder_is_a_symlink_is_refused(ppo_run, tmp_path):
    import shutil

    from echo_rl.export.vector import export_vector_run

    run = tmp_path / "run"
    shutil.copytree(ppo_run, run)
    shutil.rmtree(run / "export", ignore_errors=True)
    (tmp_path / "elsewhere").mkdir()
    (run / "export").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="export is a symlink"):
        export_vector_run(run, "onnx")
    assert list((tmp_path / "elsewhere").iterdir()) == []

"""TorchScript is a program, not weights: ``load_policy`` refuses it unless the caller opts in."""

import json
import warnings
from typing import Tuple

import numpy as np
import pytest
import torch

from echo_rl.config import ConfigError
from echo_rl.export.loading import load_policy

META = {"inputs": ["obs"], "outputs": ["logits", "values"], "agent": "ppo", "env_name": "minigrid:x", "obs_dim": 3,
        "window": 0}


class _Writes(torch.nn.Module):
    """A policy whose forward creates a file of its choosing (``torch.from_file(..., shared=True)``)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def forward(self, obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        t = torch.from_file(self.path, shared=True, size=8, dtype=torch.uint8)
        return obs.float() * 0.0 + t[0].float(), obs.float().sum(1)


@pytest.fixture
def hostile(tmp_path):
    marker, path = tmp_path / "written", tmp_path / "policy.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's deprecation notices
        torch.jit.save(torch.jit.script(_Writes(str(marker))), str(path),
                       _extra_files={"echo_rl.json": json.dumps(META)})
    return path, marker


def test_torchscript_is_refused_by_default_in_one_line(hostile):
    path, marker = hostile
    for name in (path, str(path)):
        with pytest.raises(ConfigError, match="is TorchScript: a program that runs when it is loaded") as info:
            load_policy(name)
        assert "\n" not in str(info.value) and "allow_code=True" in str(info.value)
    renamed = path.with_suffix(".onnx")  # by content, not by name: a zip archive named .onnx is refused too
    path.rename(renamed)
    with pytest.raises(ConfigError, match="is TorchScript"):
        load_policy(renamed)
    assert not marker.exists()


def test_opting_in_runs_it(hostile):
    """What the refusal protects from: with ``allow_code=True`` the file's own code runs on act()."""
    path, marker = hostile
    policy = load_policy(path, allow_code=True)
    assert policy.act(np.zeros(3, np.uint8)) in (0, 1, 2) and marker.exists()

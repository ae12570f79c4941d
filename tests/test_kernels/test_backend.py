"""The numpy path works with the compiled kernels switched off, and says so."""

import os
import subprocess
import sys

CODE = """
import numpy as np
from echo_rl.kernels import kernels_available, kernels_status
from echo_rl.replay import PrioritizedReplayBuffer
assert not kernels_available(), kernels_status()
assert 'ECHO_RL_DISABLE_NATIVE' in kernels_status()
b = PrioritizedReplayBuffer(8, seed=0)
assert not b.native
b.add({'x': np.arange(24, dtype=np.float32).reshape(12, 2)})
s = b.sample(4)
assert s.data['x'].shape == (4, 2) and set(s.indices.tolist()) <= set(range(4, 12))
try:
    PrioritizedReplayBuffer(8, use_native=True)
except RuntimeError as e:
    assert 'use_native=True' in str(e)
else:
    raise AssertionError('use_native=True must fail without the compiled kernels')
print('ok')
"""


def test_disabled_native_falls_back_to_numpy():
    env = dict(os.environ, ECHO_RL_DISABLE_NATIVE="1")
    res = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"

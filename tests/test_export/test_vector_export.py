"""Exported vector policies equal the PyTorch policy: ONNX (onnxruntime, fp32 and int8) and safetensors."""

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="ONNX export needs pip install 'echo-rl[export]'")
import torch  # noqa: E402

from echo_rl.config import ConfigError  # noqa: E402
from echo_rl.export.loading import load_policy  # noqa: E402
from echo_rl.export.parity import compare, record_observations  # noqa: E402
from echo_rl.export.vector import export_vector_run  # noqa: E402

ENV = "minigrid:MiniGrid-DoorKey-5x5-v0"


@pytest.fixture(scope="module")
def ppo_recording(ppo_run):
    return record_observations(load_policy(ppo_run), ENV, steps=64, num_envs=4, seed=5)


@pytest.mark.parametrize("fmt", ["onnx", "safetensors"])
def test_fp32_export_matches_pytorch(ppo_run, ppo_recording, fmt, tmp_path):
    path, meta = export_vector_run(ppo_run, fmt, tmp_path / ("p.onnx" if fmt == "onnx" else "p.safetensors"))
    assert meta["inputs"] == ["obs"] and meta["agent"] == "ppo" and meta["num_actions"] == 7
    report = compare(load_policy(ppo_run), load_policy(path), *ppo_recording)
    assert report["observations"] == 256
    assert report["max_logit_diff"] < 1e-4 and report["max_value_diff"] < 1e-4
    assert report["action_agreement"] == 1.0


def test_int8_export_is_smaller_and_close(ppo_run, ppo_recording, tmp_path):
    fp32, _ = export_vector_run(ppo_run, "onnx", tmp_path / "fp32.onnx")
    int8, meta = export_vector_run(ppo_run, "onnx", tmp_path / "int8.onnx", quantize="int8")
    assert int8.stat().st_size < 0.5 * fp32.stat().st_size
    ref, got = load_policy(ppo_run), load_policy(int8)
    assert got.meta["quantize"] == "int8"
    report = compare(ref, got, *ppo_recording)
    spread = float(np.ptp(ref.logits_and_values(ppo_recording[0].reshape(-1, meta["obs_dim"]))[0]))
    assert 0 < report["max_logit_diff"] < 0.1 * spread + 1e-3  # quantized, not identical, and close


def test_ppo_policy_reproduces_agent_act(ppo_run, ppo_recording):
    """The exported logits are the agent's: sampling them with act()'s generator gives act()'s actions."""
    from echo_rl.export.runs import load_vector_agent

    agent, _, _ = load_vector_agent(ppo_run)
    onnx = load_policy(export_vector_run(ppo_run, "onnx", ppo_run / "export" / "act.onnx")[0])
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    for obs in ppo_recording[0]:
        logits = torch.as_tensor(onnx.logits_and_values(obs)[0])
        expected = torch.multinomial(torch.softmax(logits, -1), 1, generator=g2).squeeze(-1).numpy()
        np.testing.assert_array_equal(agent.act(obs, g1), expected)
    agent.close()


def test_echo_agent_exports_its_plan_path(echo_run, tmp_path):
    from echo_rl.export.runs import load_vector_agent

    path, meta = export_vector_run(echo_run, "onnx", tmp_path / "echo.onnx")
    assert meta["inputs"] == ["obs", "window", "mask"] and meta["window"] >= 2
    ref, got = load_policy(echo_run), load_policy(path)
    tensors, _ = export_vector_run(echo_run, "safetensors", tmp_path / "echo.safetensors")
    plain = load_policy(tensors)  # the plan path rebuilt from the config in the header
    obs0, starts0 = record_observations(ref, ENV, steps=16, num_envs=2, seed=3)
    assert compare(ref, plain, obs0, starts0)["max_logit_diff"] < 1e-5
    obs, starts = record_observations(ref, ENV, steps=48, num_envs=4, seed=2)
    report = compare(ref, got, obs, starts)
    assert report["max_logit_diff"] < 1e-4 and report["max_value_diff"] < 1e-4
    # the plan is in the graph: the same observation with and without its episode's history differs
    got.reset()
    for o, s in zip(obs[:6], starts[:6]):
        with_history = got.logits_and_values(o, s)[0]
    assert (~starts[1:6].any(0)).any()  # some env is 5 steps into its episode
    alone = got.logits_and_values(obs[5])[0]
    assert np.abs(with_history - alone).max() > 1e-6
    # and the graph is what EchoAgent.act samples from (act draws plan noise, then the action)
    agent, config, _ = load_vector_agent(echo_run)
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    got.reset()
    for o, s in zip(obs, starts):
        logits = torch.as_tensor(got.logits_and_values(o, s)[0])
        torch.randn(len(o), config.planning_config.embedding_dim, generator=g2)
        expected = torch.multinomial(torch.softmax(logits, -1), 1, generator=g2).squeeze(-1).numpy()
        np.testing.assert_array_equal(agent.act(o, g1, s), expected)
    agent.close()


def test_policy_accepts_raw_minigrid_observations(ppo_run):
    import gymnasium as gym
    import minigrid  # noqa: F401

    from echo_rl.environments.minigrid_vector import make_minigrid_env

    policy = load_policy(ppo_run)
    raw_env, flat_env = gym.make("MiniGrid-DoorKey-5x5-v0"), make_minigrid_env(ENV)
    raw, _ = raw_env.reset(seed=11)
    flat, _ = flat_env.reset(seed=11)
    assert policy.act(raw) == policy.act(flat)
    np.testing.assert_array_equal(policy.logits_and_values(raw)[0], policy.logits_and_values(flat)[0])
    with pytest.raises(ValueError, match="observations must be"):
        policy.act(np.zeros((2, 5), np.uint8))


def test_untrained_and_unknown_runs_are_config_errors(tmp_path, ppo_run):
    from echo_rl.config import TrainingConfig

    (tmp_path / "fresh").mkdir()
    TrainingConfig(env_name=ENV).save_yaml(tmp_path / "fresh" / "config.yaml")
    with pytest.raises(ConfigError, match="not trained yet"):
        export_vector_run(tmp_path / "fresh", "onnx")
    with pytest.raises(ConfigError, match="allowed: onnx, safetensors"):
        export_vector_run(ppo_run, "tflite")
    with pytest.raises(ConfigError, match="applies to --format onnx"):
        export_vector_run(ppo_run, "safetensors", quantize="int8")
    with pytest.raises(ConfigError, match="allowed: int8"):
        export_vector_run(ppo_run, "onnx", quantize="int4")


def test_sampled_actions_follow_the_policy_and_are_seeded(ppo_run, ppo_recording):
    policy = load_policy(ppo_run)
    obs = np.repeat(ppo_recording[0][0][:1], 4000, axis=0)
    logits = policy.logits_and_values(obs[:1])[0][0]
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    policy.seed(1)
    first = policy.act(obs, deterministic=False)
    policy.seed(1)
    np.testing.assert_array_equal(first, policy.act(obs, deterministic=False))
    freq = np.bincount(first, minlength=len(probs)) / len(first)
    assert np.abs(freq - probs).max() < 0.03


def test_gymnasium_tasks_export_with_their_float_observations(tmp_path, train_run):
    run = train_run(tmp_path / "cartpole", "ppo", env_name="gym:CartPole-v1", env_config={}, num_actors=2,
                    batch_size=128, total_timesteps=256)
    path, meta = export_vector_run(run, "onnx", tmp_path / "cartpole.onnx")
    assert meta["obs_dtype"] == "float32" and meta["obs_shape"] == [4] and meta["obs_encoding"] is None
    ref = load_policy(run)
    obs, starts = record_observations(ref, "gym:CartPole-v1", steps=32, num_envs=2)
    report = compare(ref, load_policy(path), obs, starts)
    assert report["max_logit_diff"] < 1e-4 and report["action_agreement"] == 1.0
    assert isinstance(ref.act(obs[0][0]), int)

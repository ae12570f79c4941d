"""lm_config.compute_dtype=bfloat16: fp32 master weights and optimiser, a bf16 body and engine, log-probs close
to fp32; every objective path (plan, value head) trains; bad values are one line."""

import asyncio
import json

import pytest
import torch

pytest.importorskip("transformers")

from echo_rl.config import ConfigError, LMConfig, TrainingConfig  # noqa: E402
from echo_rl.lm.learner import LMLearner  # noqa: E402
from echo_rl.training.trainer import EchoRLTrainer  # noqa: E402
from tests.test_lm.test_loop import _cfg, checkpoint, save_checkpoint  # noqa: E402,F401


@pytest.mark.parametrize("agent, over", [
    ("echo-rl", {}),  # GRPO + ECHO + latent plan
    ("ppo", {"lm_config.objective": "ppo-rlhf"}),  # the value-head forward
])
def test_bf16_run_trains_with_fp32_master_weights_and_a_bf16_engine(checkpoint, tmp_path, agent, over):
    cfg = _cfg(checkpoint, agent=agent, **{"lm_config.max_updates": 1, "lm_config.compute_dtype": "bfloat16",
                                           **over})
    trainer = EchoRLTrainer(cfg, tmp_path / "run", show_progress=False)
    asyncio.run(trainer.train())
    row = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][1]
    assert row["train/updates"] == 1.0 and torch.isfinite(torch.tensor(row["lm/grad_norm"]))
    lm = trainer.agent
    assert {p.dtype for p in lm.model.parameters()} == {torch.float32}
    assert {p.dtype for p in lm.learner.engine_copy().parameters()} == {torch.bfloat16}


def test_bf16_logprobs_are_close_to_fp32_and_graded(checkpoint):
    import transformers

    from echo_rl.lm.batch import collate
    from echo_rl.types import ACTION, ENV_OUTPUT, TEMPLATE, TokenTrajectory

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    ids = list(range(3, 40))
    roles = [TEMPLATE] * 5 + [ACTION, ENV_OUTPUT] * 16
    traj = TokenTrajectory(token_ids=ids, roles=roles, behavior_logprobs=[0.0] * 37, rewards=[0.0] * 16,
                           prompt_length=5, env_output_count=16)
    out = {}
    for dt in ("float32", "bfloat16"):
        learner = LMLearner(model, 0, LMConfig(compute_dtype=dt, learning_rate=1e-5))
        batch = collate([traj], 0)
        lp = learner._logprobs(model, [traj], batch, learner._needed(batch))[0][0]
        assert lp.dtype == torch.float32
        out[dt] = lp
    diff = (out["float32"] - out["bfloat16"]).abs().max()
    assert 0 < diff < 0.1  # bf16 really ran, and stays close


def test_bad_compute_dtype_is_one_line(checkpoint):
    with pytest.raises(ConfigError, match="compute_dtype"):
        TrainingConfig().with_overrides({"lm_config.compute_dtype": "float16"})
    with pytest.raises(ConfigError, match="compute_dtype='int8' is invalid"):
        LMConfig(compute_dtype="int8")


def test_sft_cache_is_not_shared_across_compute_dtypes(checkpoint, tmp_path):
    over = {"lm_config.max_updates": 1, "lm_config.sft_cache_dir": str(tmp_path / "sft"),
            "echo_config.latent_plan": False, "lm_config.heldout_pool": 0}
    for i, dt in enumerate(("float32", "bfloat16", "bfloat16")):
        cfg = _cfg(checkpoint, **{**over, "lm_config.compute_dtype": dt})
        asyncio.run(EchoRLTrainer(cfg, tmp_path / f"run{i}", show_progress=False).train())
    cached = [json.loads((tmp_path / f"run{i}" / "metrics.jsonl").read_text().splitlines()[1])["sft/cached"]
              for i in range(3)]
    assert cached == [0.0, 0.0, 1.0]  # a bf16 warm start is not an fp32 one

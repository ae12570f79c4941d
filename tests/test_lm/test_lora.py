"""LoRA (lm_config.lora_rank): only adapters train, the engine runs merged weights, checkpoints resume."""

import asyncio

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft", reason="LoRA needs pip install 'echo-rl[lora]'")

from echo_rl.config import ConfigError, TrainingConfig  # noqa: E402
from echo_rl.lm.lora import add_lora, is_lora, merged_state_dict, plain_copy  # noqa: E402
from echo_rl.training.trainer import EchoRLTrainer  # noqa: E402

from test_loop import _cfg, checkpoint  # noqa: E402,F401  (the fixture)

LORA = {"lm_config.lora_rank": 4, "lm_config.lora_targets": "q_proj,v_proj", "lm_config.sft_learning_rate": 1e-2,
        "lm_config.learning_rate": 1e-2, "echo_config.latent_plan": False, "lm_config.heldout_pool": 1}


def _tiny_llama(checkpoint):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)


def test_merged_copy_computes_what_the_adapted_model_computes(checkpoint):
    model = add_lora(_tiny_llama(checkpoint), 4, 8.0, "q_proj,v_proj")
    assert is_lora(model) and not is_lora(_tiny_llama(checkpoint))
    with torch.no_grad():  # non-zero adapters (B starts at 0, which would make any merge look right)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    ids = torch.tensor([[3, 5, 7, 11, 13]])
    plain = plain_copy(model)
    assert not is_lora(plain)
    torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    fresh = _tiny_llama(checkpoint)
    fresh.load_state_dict(merged_state_dict(model))  # strict: exactly the plain model's keys
    torch.testing.assert_close(fresh(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_only_adapters_train_and_a_checkpoint_resumes(checkpoint, tmp_path):
    base = _tiny_llama(checkpoint).state_dict()
    run = tmp_path / "run"
    cfg = _cfg(checkpoint, total_timesteps=100, **{**LORA, "lm_config.max_updates": 1})
    trainer = EchoRLTrainer(cfg, run, show_progress=False)
    asyncio.run(trainer.train())
    state = trainer.agent.model.state_dict()
    adapters = {k: v for k, v in state.items() if ".lora_" in k}
    assert adapters and any(v.abs().sum() > 0 for k, v in adapters.items() if "lora_B" in k)  # SFT + RL moved them
    for key, value in state.items():
        if ".lora_" not in key:
            torch.testing.assert_close(value, base[key.replace(".base_layer.", ".")], atol=0, rtol=0)
    opt_params = sum(len(g["params"]) for g in trainer.agent.learner.optimizer.param_groups)
    assert opt_params == len(adapters)  # AdamW holds the adapters only
    # the engine ran the merged weights of the latest policy
    merged = merged_state_dict(trainer.agent.model)
    for key, value in trainer.agent.generator.engine_model.state_dict().items():
        torch.testing.assert_close(value, merged[key])
    more = _cfg(checkpoint, total_timesteps=100, **{**LORA, "lm_config.max_updates": 2})
    again = EchoRLTrainer(more, run, resume=True, show_progress=False)
    result = asyncio.run(again.train())
    assert result.num_updates == 2
    assert again.agent.learner.steps == trainer.agent.learner.steps + 1  # resumed, not restarted
    # the export is a plain transformers checkpoint with the adapters merged in
    from echo_rl.export.lm import export_lm_run

    path, _ = export_lm_run(run, tmp_path / "export")
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).state_dict()
    merged = merged_state_dict(again.agent.model)
    assert not any(".lora_" in k for k in exported)
    for key, value in merged.items():
        if key in exported:
            torch.testing.assert_close(exported[key], value, atol=0, rtol=0)


def test_a_target_the_model_lacks_is_one_clear_error(checkpoint, tmp_path):
    cfg = _cfg(checkpoint, **{**LORA, "lm_config.lora_targets": "c_attn"})
    with pytest.raises(ConfigError, match="lora_targets='c_attn' is invalid: the model has no module 'c_attn'"):
        asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="lora_targets"):
        TrainingConfig(env_name="minigrid", backbone="tiny", lm_config={"lora_rank": 4, "lora_targets": " , "})


def test_sft_cache_is_not_shared_between_full_fine_tuning_and_lora(checkpoint, tmp_path):
    """A full fine-tune's warm start is not an adapter warm start (nor loadable into the adapted model)."""
    import json

    sft = {"lm_config.max_updates": 1, "lm_config.sft_cache_dir": str(tmp_path / "sft")}
    arms = [{}, LORA, LORA, {**LORA, "lm_config.lora_rank": 8}]
    for i, over in enumerate(arms):
        cfg = _cfg(checkpoint, **{**LORA, **over, "lm_config.lora_rank": over.get("lm_config.lora_rank", 0),
                                  **sft})
        asyncio.run(EchoRLTrainer(cfg, tmp_path / f"run{i}", show_progress=False).train())
    cached = [json.loads((tmp_path / f"run{i}" / "metrics.jsonl").read_text().splitlines()[1])["sft/cached"]
              for i in range(len(arms))]
    assert cached == [0.0, 0.0, 1.0, 0.0]

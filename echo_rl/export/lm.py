"""Export a language-model run as a plain transformers checkpoint directory.

The LM agent trains the backbone's full weights or LoRA adapters (``LMAgent.state_dict()["model"]``;
adapters are merged here: W + scale·B·A), so the export is the backbone rebuilt as the run built it
(``echo_rl.lm.loop.load_policy``: the same preset, seed and tokenizer),
the trained weights loaded, and ``save_pretrained`` for model and tokenizer
(chat template included). ``transformers.AutoModelForCausalLM.from_pretrained``,
``echo-rl serve --backbone DIR`` and vLLM read that directory as is.
"""

from __future__ import annotations

from pathlib import Path

from echo_rl.config import ConfigError
from echo_rl.export.runs import newest_payload, run_config
from echo_rl.models.save import write_transformers
from echo_rl.utils.jail import Jail

def export_lm_run(run_dir: str | Path, out: str | Path | None = None) -> tuple[Path, dict]:
    config = run_config(run_dir)
    if not config.text_task:
        raise ConfigError(f"--run-dir {run_dir} is a vector-policy run ({config.agent} on {config.env_name}): "
                          f"export it with --format onnx or safetensors")
    payload, ckpt = newest_payload(run_dir, config)
    weights = payload["state"].get("model")
    if not isinstance(weights, dict) or not weights:
        raise ConfigError(f"--run-dir {run_dir}/{ckpt}: the checkpoint holds no language-model weights ('model')")
    from echo_rl.lm.loop import load_policy as load_backbone_policy  # gymnasium, minigrid: loaded on first use

    model, tokenizer = load_backbone_policy(config.backbone, config.seed)
    lm = config.lm_config
    if lm.lora_rank:  # the run trained adapters: rebuild them, load, and merge into plain weights
        from echo_rl.lm.lora import add_lora, plain_copy  # needed on this path only

        model = add_lora(model, lm.lora_rank, lm.lora_alpha, lm.lora_targets)
    try:
        model.load_state_dict(weights)
        if lm.lora_rank:
            model = plain_copy(model)
    except RuntimeError as exc:
        raise ConfigError(f"--run-dir {run_dir}/{ckpt}: its weights do not fit backbone {config.backbone!r} "
                          f"({' '.join(str(exc).split())[:160]})") from None

    # inside the run directory, export/ and export/transformers/ are never symlinks to elsewhere
    path = Path(out) if out else Jail(run_dir).path("export/transformers")
    info = {"echo_rl_export": 1, "format": "transformers", "run_dir": str(run_dir), "checkpoint": ckpt,
            "backbone": config.backbone, "env_name": config.env_name, "agent": config.agent, "seed": config.seed,
            "step": payload["step"]}
    return write_transformers(model, tokenizer, path, info), info

"""`echo-rl export`: a trained run -> an ONNX / safetensors policy, or a transformers checkpoint (LM runs)."""

from __future__ import annotations

import argparse

from echo_rl.config import ConfigError

NAME = "export"
HELP = ("export a trained run: vector policies to ONNX (optionally int8) or safetensors, LM runs to a "
        "transformers directory")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", required=True, help="a trained run directory (its newest checkpoint is exported)")
    p.add_argument("--format", default=None,
                   help="onnx or safetensors for vector policies (default onnx); transformers for language-model "
                        "runs (the default there)")
    p.add_argument("--quantize", default=None, help="int8: dynamic int8 weights of the linear layers (onnx)")
    p.add_argument("--out", default=None, help="output file (vector) or directory (transformers); default "
                                               "RUN/export/policy[-int8].onnx, RUN/export/policy.safetensors or "
                                               "RUN/export/transformers")
    p.add_argument("--no-check", action="store_true",
                   help="skip the parity check of the exported policy against PyTorch on recorded observations")


def run(args: argparse.Namespace) -> int:
    import torch

    from echo_rl.export.runs import run_config  # torch: loaded on first use

    torch.set_num_threads(1)  # networks this small run batch-of-a-few inference faster on one thread

    config = run_config(args.run_dir)
    fmt = args.format or ("transformers" if config.text_task else "onnx")
    if config.text_task or fmt == "transformers":
        if fmt != "transformers":
            raise ConfigError(f"--format {fmt!r} is invalid for a language-model run: allowed: transformers")
        if args.quantize:
            raise ConfigError("--quantize applies to vector policies; a transformers export keeps the run's weights")
        from echo_rl.export.lm import export_lm_run  # torch: loaded on first use

        path, info = export_lm_run(args.run_dir, args.out)
        print(f"exported: {path} (transformers, backbone {info['backbone']}, {info['checkpoint']}); "
              f"serve it with: echo-rl serve --backbone {path}")
        return 0
    from echo_rl.export.parity import check_parity  # torch: loaded on first use
    from echo_rl.export.vector import check_format, export_vector_run  # torch: loaded on first use

    check_format(fmt, args.quantize)
    path, meta = export_vector_run(args.run_dir, fmt, args.out, args.quantize)
    inputs = ", ".join(meta["inputs"])
    print(f"exported: {path} ({fmt}{', int8' if args.quantize else ''}, {meta['agent']} on {meta['env_name']}, "
          f"{meta['checkpoint']}; inputs {inputs} -> logits, value)")
    if not args.no_check:
        report = check_parity(args.run_dir, path)
        print(f"parity vs PyTorch on {report['observations']} recorded observations: max |logit diff| "
              f"{report['max_logit_diff']:.2e}, max |value diff| {report['max_value_diff']:.2e}, greedy actions "
              f"agree {report['action_agreement']:.1%}")
    return 0

"""Export a vector policy to ONNX (optionally with int8 weights) or safetensors.

Both files are data, never code: ONNX is a graph of standard operators, and a
safetensors file holds tensors and a JSON header, which ``load_policy`` turns
back into the policy by building the run's network from the config it names.
(TorchScript is a program that runs when loaded, so it is not written here and
is loaded only on request: ``load_policy(path, allow_code=True)``.)

Both carry the export metadata (``graph.policy_graph``: agent, env, inputs, the
observation encoding) — ONNX in ``metadata_props["echo_rl"]``, safetensors in
its header's ``__metadata__["echo_rl"]`` with the run's config beside it — so a
loader needs nothing else. ONNX uses the TorchScript-tracing exporter
(``dynamo=False``): one self-contained file in well under a second for these
small networks. int8 is onnxruntime's dynamic quantization of the linear
layers' weights (``quantize_dynamic``); embeddings stay float.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

from echo_rl.config import ConfigError
from echo_rl.export.graph import example_inputs, policy_graph
from echo_rl.export.runs import load_vector_agent
from echo_rl.utils.jail import Jail

FORMATS = ("onnx", "safetensors")
QUANTIZE = ("int8",)
SUFFIX = {"onnx": ".onnx", "safetensors": ".safetensors"}
META_KEY = "echo_rl"
TS_EXTRA = "echo_rl.json"  # the metadata inside TorchScript files of earlier versions
ONNX_EXTRA = "pip install 'echo-rl[export]'"


def require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ImportError(f"ONNX export and inference need onnx and onnxruntime: {ONNX_EXTRA}") from None


def require_safetensors() -> None:
    try:
        import safetensors  # noqa: F401
    except ImportError:
        raise ImportError(f"safetensors export and loading need safetensors: {ONNX_EXTRA}") from None


def _dynamic_axes(meta: dict) -> dict:
    axes = {name: {0: "batch"} for name in meta["inputs"] + meta["outputs"]}
    return axes


def export_onnx(graph: nn.Module, meta: dict, out: Path, quantize: str | None = None) -> Path:
    require_onnx()
    import onnx

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        raw = Path(tmp) / "fp32.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
            torch.onnx.export(graph, example_inputs(meta), str(raw), input_names=meta["inputs"],
                              output_names=meta["outputs"], dynamic_axes=_dynamic_axes(meta), dynamo=False,
                              opset_version=17)
        src = raw
        if quantize == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            src = Path(tmp) / "int8.onnx"
            root = logging.getLogger()
            level, root.level = root.level, logging.ERROR  # its "consider pre-processing" notice is for CNNs
            try:
                quantize_dynamic(str(raw), str(src), weight_type=QuantType.QInt8)
            finally:
                root.setLevel(level)
        model = onnx.load(str(src))
        del model.metadata_props[:]
        entry = model.metadata_props.add()
        entry.key, entry.value = META_KEY, json.dumps({**meta, "quantize": quantize})
        onnx.checker.check_model(model)
        part = Path(tmp) / "final.onnx"
        onnx.save(model, str(part))
        os.replace(part, out)
    return out


def export_safetensors(graph: nn.Module, meta: dict, out: Path, config_dict: dict) -> Path:
    """The graph's tensors, with the metadata and the run's config (to rebuild the network) in the header."""
    require_safetensors()
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in graph.state_dict().items()}  # no shared storage
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".tmp-policy-", suffix=".safetensors")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={META_KEY: json.dumps({**meta, "quantize": None, "config": config_dict})})
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def check_format(fmt: str, quantize: str | None) -> None:
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} is invalid: allowed: {', '.join(FORMATS)} (language-model runs: "
                          f"transformers)")
    if quantize is not None and quantize not in QUANTIZE:
        raise ConfigError(f"--quantize {quantize!r} is invalid: allowed: {', '.join(QUANTIZE)}")
    if quantize is not None and fmt != "onnx":
        raise ConfigError(f"--quantize {quantize} applies to --format onnx; a {fmt} export keeps float32 weights")


def export_vector_run(run_dir: str | Path, fmt: str, out: str | Path | None = None,
                      quantize: str | None = None) -> tuple[Path, dict]:
    """Export the newest checkpoint of a vector run; (file written, metadata)."""
    check_format(fmt, quantize)
    (require_onnx if fmt == "onnx" else require_safetensors)()
    agent, config, ckpt = load_vector_agent(run_dir)
    try:
        graph, meta = policy_graph(agent, config)
        meta["checkpoint"] = ckpt
        name = "policy" + ("-int8" if quantize else "") + SUFFIX[fmt]
        if out:
            path = Path(out)
            if path.exists() and path.is_dir():
                path = path / name
        else:  # inside the run directory: its export/ folder is never a symlink to elsewhere
            path = Jail(run_dir).path("export", create=True) / name
        if fmt == "onnx":
            export_onnx(graph, meta, path, quantize)
        else:
            export_safetensors(graph, meta, path, config.to_dict())
    finally:
        agent.close()
    return path, meta

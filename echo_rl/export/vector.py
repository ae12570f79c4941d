"""Export a vector policy to ONNX or TorchScript, optionally with int8 weights.

Both files carry the export metadata (``graph.policy_graph``: agent, env,
inputs, the observation encoding) — ONNX in ``metadata_props["echo_rl"]``,
TorchScript as the extra file ``echo_rl.json`` — so a loader needs nothing else.
ONNX uses the TorchScript-tracing exporter (``dynamo=False``): one
self-contained file in well under a second for these small networks.
int8 is dynamic quantization of the linear layers' weights (onnxruntime's
``quantize_dynamic`` / ``torch.ao.quantization.quantize_dynamic``); embeddings
stay float.
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

FORMATS = ("onnx", "torchscript")
QUANTIZE = ("int8",)
SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}
META_KEY = "echo_rl"
TS_EXTRA = "echo_rl.json"
ONNX_EXTRA = "pip install 'echo-rl[export]'"


def require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ImportError(f"ONNX export and inference need onnx and onnxruntime: {ONNX_EXTRA}") from None


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


def export_torchscript(graph: nn.Module, meta: dict, out: Path, quantize: str | None = None) -> Path:
    if quantize == "int8":  # in place: an Echo graph reaches its modules through the (throwaway) agent
        graph = torch.ao.quantization.quantize_dynamic(graph, {nn.Linear}, dtype=torch.qint8, inplace=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix="tmp-policy-", suffix=".pt")  # torch names the archive
    os.close(fd)                                                                  # after the file's stem
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's deprecation notices: TorchScript is what is asked for
            traced = torch.jit.trace(graph, example_inputs(meta), check_trace=False)
            torch.jit.save(traced, tmp, _extra_files={TS_EXTRA: json.dumps({**meta, "quantize": quantize})})
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


def export_vector_run(run_dir: str | Path, fmt: str, out: str | Path | None = None,
                      quantize: str | None = None) -> tuple[Path, dict]:
    """Export the newest checkpoint of a vector run; (file written, metadata)."""
    check_format(fmt, quantize)
    if fmt == "onnx":
        require_onnx()
    agent, config, ckpt = load_vector_agent(run_dir)
    try:
        graph, meta = policy_graph(agent, config)
        meta["checkpoint"] = ckpt
        name = "policy" + ("-int8" if quantize else "") + SUFFIX[fmt]
        path = Path(out) if out else Path(run_dir) / "export" / name
        if path.exists() and path.is_dir():
            path = path / name
        (export_onnx if fmt == "onnx" else export_torchscript)(graph, meta, path, quantize)
    finally:
        agent.close()
    return path, meta

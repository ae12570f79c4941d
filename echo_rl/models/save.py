"""A transformers checkpoint directory written all at once: what ``echo-rl export`` and external training leave,
and what ``--backbone``, ``serve`` and vLLM read."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from echo_rl.config import ConfigError

INFO_FILE = "echo_rl_export.json"  # beside the weights: what was exported, from which run


def write_transformers(model: Any, tokenizer: Any, path: Path, info: dict) -> Path:
    """``save_pretrained`` of model and tokenizer into ``path`` with ``info`` beside them, all at once: a
    reader sees the old directory or the new one, never half of it; only an earlier export is replaced."""
    if path.exists() and not (path.is_dir() and (not any(path.iterdir()) or (path / INFO_FILE).is_file())):
        raise ConfigError(f"{path} exists and is not an earlier export: give a new directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path

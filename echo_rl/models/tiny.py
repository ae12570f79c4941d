"""Tiny Llama/Qwen-architecture models built from config, saved as standard checkpoints.

A tiny model is a real transformers checkpoint directory (``config.json``,
``model.safetensors``, ``tokenizer.json`` with a ChatML chat template), so it
is loaded by the very same :class:`~echo_rl.models.local.LocalBackbone` path
as a downloaded Qwen or Llama. Its byte-level BPE tokenizer is trained with
the ``tokenizers`` library on task text (the ReAct ALFWorld prompts, CRUXEval
code, ARC grids and MiniGrid words when the data folder is present, plus the
agents' own prompt wording), so any string still encodes. Weights are the
architecture's random initialisation under a fixed seed: a tiny model is a
fast, offline stand-in for plumbing, serving and training tests — it knows
nothing until something trains it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from echo_rl.config import ConfigError
from echo_rl.utils.optional import require
from echo_rl.utils.paths import data_root

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML, as Qwen2 checkpoints ship it (without the tool-calling branches).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyPreset:
    architecture: str  # "qwen2" or "llama"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int


PRESETS: dict[str, TinyPreset] = {
    "tiny": TinyPreset("qwen2", 2048, 64, 2, 4, 2, 256, 4096),
    "tiny-llama": TinyPreset("llama", 2048, 64, 2, 4, 2, 256, 4096),
    "small": TinyPreset("qwen2", 8192, 256, 4, 8, 4, 1024, 8192),
}

# Wording of the agents' prompts and of MiniGrid-as-text, so the tokenizer knows it without data.
_BUILTIN_TEXT = """
You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, a drawer 1.
Your task is to: put some spraybottle on toilet. think: First I need to find a spraybottle. OK.
go to cabinet 1. open drawer 1. take apple 1 from countertop 1. put apple 1 in/on fridge 1.
heat egg 1 with microwave 1. cool potato 1 with fridge 1. clean lettuce 1 with sinkbasin 1.
use desklamp 1. examine alarmclock 1. inventory. look. Nothing happens. You arrive at loc 3.
Interact with a household to solve a task. Here are two examples. Here is the task.
Propose the next actions. Evaluate how likely this leads to completing the task: sure likely impossible.
turn left, turn right, move forward, pick up, drop, toggle, done. a yellow key 1 step forward.
a grey wall 2 steps right. a locked yellow door. Get the key, open the door and reach the green goal.
search[red shoes] click[Buy Now] click[< Prev] click[Description] assert f(input) == output
def f(nums): return sorted(nums) [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
"""


def task_corpus(max_chars: int = 400_000) -> list[str]:
    """Task text for the tokenizer: local benchmark data when present, plus built-in wording."""
    texts = [_BUILTIN_TEXT]
    root = data_root()
    prompts = root / "alfworld" / "react" / "alfworld_3prompts.json"
    if prompts.is_file():
        texts.extend(json.loads(prompts.read_text()).values())
    crux = root / "cruxeval" / "cruxeval.jsonl"
    if crux.is_file():
        for line in crux.read_text().splitlines()[:400]:
            row = json.loads(line)
            texts.append(f"{row['code']}\nassert f({row['input']}) == {row['output']}")
    arc = root / "arc" / "training"
    if arc.is_dir():
        for f in sorted(arc.glob("*.json"))[:40]:
            task = json.loads(f.read_text())
            for pair in task["train"]:
                texts.append("\n".join(" ".join(map(str, r)) for r in pair["input"]))
    out, total = [], 0
    for t in texts:
        if total >= max_chars:
            break
        out.append(t[: max_chars - total])
        total += len(out[-1])
    return out


def train_tokenizer(corpus: Iterable[str], vocab_size: int):
    """Byte-level BPE (GPT-2 / Qwen style) with the ChatML special tokens."""
    tokenizers = require("tokenizers", "llm")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return tok


def build_tiny(out_dir: str | Path, preset: str = "tiny", *, seed: int = 0, corpus: list[str] | None = None,
               overwrite: bool = True) -> Path:
    """Build a tiny checkpoint directory at ``out_dir`` (written atomically).

    With ``overwrite=False`` a directory that appeared meanwhile (another
    process built the same cache entry) is kept and this build discarded.
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown tiny preset {preset!r}; allowed: {', '.join(PRESETS)}")
    transformers = require("transformers", "llm")
    torch = require("torch", "llm")
    transformers.utils.logging.disable_progress_bar()
    p = PRESETS[preset]
    corpus = corpus if corpus is not None else task_corpus()
    raw = train_tokenizer(corpus, p.vocab_size)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    vocab = len(tokenizer)
    eos_id, pad_id = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    common = dict(vocab_size=vocab, hidden_size=p.hidden_size, num_hidden_layers=p.num_layers,
                  num_attention_heads=p.num_heads, num_key_value_heads=p.num_kv_heads,
                  intermediate_size=p.intermediate_size, max_position_embeddings=p.max_position_embeddings,
                  eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None, tie_word_embeddings=True)
    if p.architecture == "qwen2":
        config = transformers.Qwen2Config(**common)
        model_cls = transformers.Qwen2ForCausalLM
    else:
        config = transformers.LlamaConfig(**common)
        model_cls = transformers.LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):  # the caller's RNG stream must not depend on a cache miss
        torch.manual_seed(seed)
        model = model_cls(config)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}-"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        meta = {"preset": preset, "seed": seed, **asdict(p), "corpus_chars": sum(map(len, corpus)),
                "corpus_sha256": _corpus_hash(corpus), "note": "random initialisation; untrained"}
        (tmp / "echo_rl_tiny.json").write_text(json.dumps(meta, indent=1))
        if out_dir.exists() and overwrite:
            shutil.rmtree(out_dir)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if overwrite or not (out_dir / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _corpus_hash(corpus: list[str]) -> str:
    h = hashlib.sha256()
    for t in corpus:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()


def cache_dir() -> Path:
    """``$ECHO_RL_CACHE_DIR`` or ``~/.cache/echo_rl``."""
    return Path(os.environ.get("ECHO_RL_CACHE_DIR") or Path.home() / ".cache" / "echo_rl").expanduser()


def tiny_checkpoint(preset: str = "tiny", *, seed: int = 0) -> Path:
    """The cached checkpoint of a preset, built on first use (keyed by preset, seed and corpus)."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown tiny preset {preset!r}; allowed: {', '.join(PRESETS)}")
    corpus = task_corpus()
    key = hashlib.sha256(json.dumps([asdict(PRESETS[preset]), seed, _corpus_hash(corpus)]).encode()).hexdigest()[:12]
    path = cache_dir() / "tiny" / f"{preset}-s{seed}-{key}"
    if not (path / "config.json").is_file():
        build_tiny(path, preset, seed=seed, corpus=corpus, overwrite=False)
    return path

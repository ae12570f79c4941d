"""Local causal-LM checkpoints through transformers, with their own chat template.

There is no decode loop here: :class:`LocalBackbone` decodes with transformers' ``generate`` (any
architecture), and callers that decode at scale put the checkpoint behind the execution engine, the project's
one decode loop (``prompting.engine_backbone.engine_backed``: prompting agents, evaluation, the AI judge;
``echo-rl serve``). Reported log-probs are those of the model's distribution (before temperature / top-p), as
vLLM reports them by default; teacher-forced scoring is :mod:`echo_rl.models.teacher_forcing`'s.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

from echo_rl.config import ConfigError
from echo_rl.models.backbone import (Backbone, Completion, Message, SamplingParams, TextDelta,
                                     TokenLogprob, Usage, check_messages)
from echo_rl.engine.errors import ContextLengthError
from echo_rl.models.chat_template import apply_chat_template
from echo_rl.utils.optional import require

DTYPES = ("auto", "float32", "bfloat16", "float16")
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} is invalid: CUDA is not available on this machine; allowed: auto, cpu")
    if not (device == "cpu" or device == "mps" or device.startswith("cuda")):
        raise ConfigError(f"device={device!r} is invalid: allowed: auto, cpu, cuda, cuda:N, mps")
    return device


def pick_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} is invalid: allowed: {', '.join(DTYPES)}")
    if dtype == "auto":  # half precision only where it is fast
        return torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, dtype)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.tiktoken")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def check_checkpoint_dir(path: Path) -> None:
    """Fail fast, in one line, on a directory that cannot be served: before, a missing tokenizer was
    accepted (every prompt then encoded to nothing) and missing weights surfaced as a traceback."""
    where = repr(str(path))
    if not path.exists():
        raise ConfigError(f"checkpoint directory {where} does not exist")
    if not path.is_dir():
        raise ConfigError(f"backbone path {where} is not a checkpoint directory (it is a file)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"backbone path {where} is not a checkpoint directory (no config.json)")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"checkpoint {where} has no tokenizer: expected one of {', '.join(TOKENIZER_FILES)} "
                          "next to config.json")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ConfigError(f"checkpoint {where} has no weights: expected one of {', '.join(WEIGHT_FILES)}")


CUSTOM_CODE = ("echo-rl never runs code from a model directory (every load passes trust_remote_code=False): use a "
               "checkpoint of a model type transformers knows")


def check_no_custom_code(path: Path) -> None:
    """A ``config.json`` whose ``model_type`` transformers does not know loads only by running the directory's own
    Python (``auto_map``): refused here, in one line, before transformers reads anything else."""
    import json

    from transformers import CONFIG_MAPPING

    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return  # unreadable: the loader reports it, in one line (load_errors)
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else None
    if isinstance(model_type, str) and model_type not in CONFIG_MAPPING:
        code = " with code of its own (auto_map)" if "auto_map" in cfg else ""
        raise ConfigError(f"checkpoint {str(path)!r}: model_type {model_type[:80]!r} is not one transformers "
                          f"knows{code}; {CUSTOM_CODE}")


@contextlib.contextmanager
def load_errors(path: Path, what: str) -> Iterator[None]:
    """Turn a loader's exception (a corrupt safetensors header, a truncated shard) into a one-line ConfigError.
    Every ``from_pretrained`` passes ``trust_remote_code=False`` (a model directory's Python never runs, and
    transformers never asks); a directory that needs its own code is named as such, not told to opt in."""
    try:
        yield
    except (ImportError, MemoryError, ConfigError):
        raise
    except Exception as exc:  # noqa: BLE001 - the loaders raise many types; the message names the cause
        if "trust_remote_code" in str(exc):
            raise ConfigError(f"checkpoint {str(path)!r}: loading its {what} needs Python code from the directory "
                              f"(auto_map); {CUSTOM_CODE}") from None
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(f"checkpoint {str(path)!r}: cannot load its {what}: {type(exc).__name__}: {first}") from None


class LocalBackbone(Backbone):
    """Any causal LM saved as a transformers checkpoint directory (local files only)."""

    def __init__(self, path: str | Path, *, device: str = "auto", dtype: str = "auto", name: str | None = None,
                 max_context: int | None = None) -> None:
        super().__init__()
        transformers = require("transformers", "llm")
        torch = require("torch", "llm")
        transformers.utils.logging.disable_progress_bar()
        path = Path(path).expanduser()
        check_checkpoint_dir(path)
        self.path = path
        self.name = name or path.name
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        check_no_custom_code(path)
        with load_errors(path, "tokenizer"):
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                                                        trust_remote_code=False)
        if not self.tokenizer("hello world", add_special_tokens=False)["input_ids"]:
            raise ConfigError(f"checkpoint {str(path)!r}: its tokenizer encodes text to no tokens (a broken or "
                              "missing tokenizer.json / vocabulary)")
        with load_errors(path, "weights"):
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), local_files_only=True, dtype=self.dtype, trust_remote_code=False).to(self.device).eval()
        rows = self.model.get_input_embeddings().weight.shape[0]
        if len(self.tokenizer) > rows:
            raise ConfigError(f"checkpoint {str(path)!r}: the tokenizer has {len(self.tokenizer)} tokens but the "
                              f"model's embedding has {rows} rows (tokenizer and weights do not belong together)")
        cfg_ctx = getattr(self.model.config, "max_position_embeddings", None) or 2048
        self.max_context = int(max_context or cfg_ctx)
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self._lock = threading.Lock()
        self._torch = torch

    # -- tokens ----------------------------------------------------------------
    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"checkpoint {str(self.path)!r} has no chat template; use complete() for raw text")
        # the template came from the checkpoint directory: rendered under time/memory/size limits
        return apply_chat_template(self.tokenizer, check_messages(messages, tools=True),
                                   add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def chat_prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        return self.encode(self.render_chat(messages))

    def _fit(self, prompt_ids: list[int], max_tokens: int) -> int:
        room = self.max_context - len(prompt_ids)
        if room < 1:
            raise ContextLengthError(f"prompt has {len(prompt_ids)} tokens; the model's context is "
                                     f"{self.max_context} tokens")
        return min(max_tokens, room)

    # -- decoding ----------------------------------------------------------------
    def generate_ids(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[TokenLogprob]:
        """The sampled tokens (id, log-prob, top alternatives), decoded by transformers' ``generate``.

        Greedy below the engine's ``MIN_TEMPERATURE``, else softmax at the temperature with top-p (no top-k,
        none of the checkpoint's generation defaults); decoding ends at EOS, the budget, or a stop string.
        A seed draws the same tokens every time and leaves the caller's torch RNG as it was."""
        torch = self._torch
        max_new = self._fit(prompt_ids, params.max_tokens)
        if params.seed is not None and (isinstance(params.seed, bool) or not isinstance(params.seed, int)
                                        or not SEED_RANGE[0] <= params.seed <= SEED_RANGE[1]):
            raise ConfigError(f"seed={params.seed!r} is invalid: must be an integer in [-2**63, 2**64 - 1]")
        from transformers import GenerationConfig, StoppingCriteriaList

        from echo_rl.engine.sampling import MIN_TEMPERATURE  # torch: loaded on first use

        greedy = params.temperature < MIN_TEMPERATURE
        # every logits processor set explicitly: a field left at None takes the checkpoint's generation_config
        sampling = {} if greedy else {"temperature": float(params.temperature), "top_p": float(params.top_p),
                                      "top_k": 0, "min_p": 0.0, "typical_p": 1.0, "epsilon_cutoff": 0.0,
                                      "eta_cutoff": 0.0}
        config = GenerationConfig(max_new_tokens=max_new, min_new_tokens=0, do_sample=not greedy, **sampling,
                                  repetition_penalty=1.0, no_repeat_ngram_size=0, num_beams=1,
                                  eos_token_id=sorted(self.eos_ids) or None, pad_token_id=self._pad_id(),
                                  output_logits=True, return_dict_in_generate=True)
        ids = torch.tensor([prompt_ids], device=self.device)
        stops = StoppingCriteriaList([_StopStrings(self.tokenizer, params.stop, len(prompt_ids))] if params.stop
                                     else [])
        with self._lock, torch.inference_mode(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                      stopping_criteria=stops)
        for tok, logits in zip(out.sequences[0, len(prompt_ids):].tolist(), out.logits):
            logp = torch.log_softmax(logits[0].float().cpu(), dim=-1)  # the model's own distribution
            top = []
            if params.top_logprobs:
                vals, idx = torch.topk(logp, params.top_logprobs)
                top = [(self.tokenizer.decode([int(i)]), float(v)) for v, i in zip(vals, idx)]
            yield TokenLogprob(self.tokenizer.decode([tok]), float(logp[tok]), tok, top)
            if tok in self.eos_ids:
                return

    def _pad_id(self) -> int | None:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else min(self.eos_ids, default=None)

    def stream_ids(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[TextDelta | Completion]:
        """Yield text deltas (with the tokens they complete) as they become final, then the :class:`Completion`.

        Text that could still turn into a stop string, or ends in half a UTF-8
        character, is held back until it is decided.
        """
        tokens: list[TokenLogprob] = []
        sent, generated, tok_sent = 0, 0, 0
        finish = "length"
        text = ""
        hold = max((len(s) for s in params.stop), default=1) - 1
        for t in self.generate_ids(prompt_ids, params):
            generated += 1  # every sampled token is paid for, EOS and stop-string tokens included
            if t.token_id in self.eos_ids:
                finish = "stop"
                break
            tokens.append(t)
            text = self.tokenizer.decode([x.token_id for x in tokens])
            hits = [i for i in (text.find(s, max(0, sent - len(s))) for s in params.stop) if i >= 0]
            if hits:
                cut = min(hits)
                text, finish = text[:cut], "stop"
                tokens = _trim_tokens(tokens, self.tokenizer, cut)
                break
            safe = len(text) - hold
            if text.endswith("\ufffd"):
                safe = min(safe, len(text) - 1)
            if safe > sent:
                yield TextDelta(text[sent:safe], tokens[tok_sent:])
                sent, tok_sent = safe, len(tokens)
        if len(text) > sent or tokens[tok_sent:]:
            yield TextDelta(text[sent:], tokens[tok_sent:])
        usage = Usage(len(prompt_ids), generated, 0.0, 1)
        self._record(usage)
        yield Completion(text, finish, usage, self.name, token_ids=[t.token_id for t in tokens],
                         prompt_token_ids=list(prompt_ids), logprobs=tokens)

    def _run(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        done = None
        for item in self.stream_ids(prompt_ids, params):
            if isinstance(item, Completion):
                done = item
        assert done is not None
        if not params.logprobs:
            done.logprobs = None
        return done

    # -- protocol ------------------------------------------------------------------
    def chat(self, messages: Sequence[Message], **sampling: Any) -> Completion:
        return self._run(self.chat_prompt_ids(messages), SamplingParams(**sampling))

    def complete(self, prompt: str, **sampling: Any) -> Completion:
        ids = self.encode(prompt)
        if not ids:
            raise ConfigError("prompt is empty")
        return self._run(ids, SamplingParams(**sampling))

    def stream_chat(self, messages: Sequence[Message], **sampling: Any) -> Iterator[str | Completion]:
        return self.stream_ids(self.chat_prompt_ids(messages), SamplingParams(**sampling))

    def logprob_rows(self, prompt_ids: Sequence[int], continuations: Sequence[Sequence[int]]) -> Any:
        """Teacher-forced log-prob rows of each continuation after the prompt (temperature 1, one forward), under
        the model's lock: :func:`echo_rl.models.teacher_forcing.continuation_logprobs`, shared with the server's
        reported log-probs and the rollout worker's candidate scorer."""
        from echo_rl.models.teacher_forcing import continuation_logprobs  # torch: loaded on first use

        with self._lock:
            return continuation_logprobs(self.model, prompt_ids, continuations)

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log p(ids[i] | ids[:i]) for i >= 1 (used for echo scoring)."""
        from echo_rl.models.teacher_forcing import token_logprobs  # torch: loaded on first use

        if len(ids) > self.max_context:
            raise ContextLengthError(f"text has {len(ids)} tokens; the model's context is {self.max_context} tokens")
        return token_logprobs(self.logprob_rows(ids[:1], [ids[1:]]), [ids[1:]])[0] if len(ids) > 1 else []

    def score(self, messages: Sequence[Message], continuations: Sequence[str]) -> list[float]:
        prompt = self.chat_prompt_ids(messages)
        scores = []
        for cont in continuations:
            cont_ids = self.encode(cont)
            if not cont_ids:
                raise ConfigError("cannot score an empty continuation")
            scores.append(float(sum(self.prompt_logprobs(prompt + cont_ids)[len(prompt) - 1:])))
        self._record(Usage(len(prompt) * len(continuations), 0, 0.0, len(continuations)))
        return scores

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]


def _trim_tokens(tokens: list[TokenLogprob], tokenizer: Any, cut: int) -> list[TokenLogprob]:
    """Keep the shortest token prefix whose text covers ``cut`` characters (the stop string's start)."""
    for n in range(len(tokens) + 1):
        if len(tokenizer.decode([t.token_id for t in tokens[:n]])) >= cut:
            return tokens[:n]
    return tokens


class _StopStrings:
    """Ends ``generate`` once the generated text (not the prompt) holds a stop string; the caller cuts it."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_len: int) -> None:
        self.tokenizer, self.stop, self.prompt_len = tokenizer, tuple(stop), prompt_len

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        text = self.tokenizer.decode(input_ids[0, self.prompt_len:])
        return torch.tensor([any(s in text for s in self.stop)], device=input_ids.device)

"""Engine vs transformers ``generate`` on multi-turn agent episodes: interleaved repetitions, per-rep ratios.

Workload (``--workload alfworld``, the default on the real model): ``--episodes`` concurrent ALFWorld
episodes replayed from the ReAct paper's transcripts (``shared/data/alfworld/react``): each turn's
observation is the environment's text from the transcript, wrapped in SmolLM2's chat markers and
tokenized once; the model generates ``--act-len`` action tokens greedily (no early stop); every episode
starts with the same system prompt. Observations do not depend on the actions, so every method sees the
same prompts whenever the greedy actions agree (reported). ``--workload minigrid``: MiniGrid-as-text
episodes (``--minigrid-env``, default DoorKey-8x8), each turn's observation the text environment's own,
along the env's expert path (seeds whose expert needs fewer than ``--turns`` steps are skipped), the same
replay rule. ``--workload random`` draws token ids instead (used with ``--model random`` for the smoke test).

Methods:
  engine   AsyncExecutionEngine: asyncio episodes, token-level dispatch, radix KV cache.
  hf_a     transformers generate per turn, all episodes batched (left padding), no reuse:
           every turn recomputes every episode's whole history.
  hf_b     transformers generate per episode with a DynamicCache carried across turns
           (per-episode reuse; batch 1, since ragged histories cannot share one cache).
  llamacpp llama.cpp (``llama-cpp-python``, the ``bench`` extra) on the same checkpoint converted to GGUF at
           the run's precision (``--gguf``: f32 for float32, bf16 for bfloat16), one episode after another
           with its KV cache carried across turns (it keeps the longest common prefix, so the next episode
           reuses the system prompt too): the prefix-caching CPU server users run instead. Greedy
           (top-k 1, no repeat penalty), its KV cache in the run's dtype, its own threads = ``--threads``.

Precision (``--dtype float32|bfloat16``): the model's weights are cast once and every method runs on that
same model, so the engine (working KV and radix pool in the weights' dtype) and both ``generate`` anchors
compute at the same precision and the ratios compare like with like. In bfloat16, greedy choices at
near-ties may differ between the engine's packed kernels and ``generate``'s, and a divergent action changes
the later turns' histories: agreement is reported per action and per token.

Fairness: every method runs a warm-up episode first; then ``--reps`` repetitions, the method order
reversed in every other one (ABC, CBA, ...), each engine run on a fresh engine (empty cache). Ratios are
per repetition (wall and CPU seconds), reported as median [min, max]. ``os.getloadavg()`` is printed
next to every run: the box is shared.

ETPS = (prompt tokens incl. reused + generated tokens) / wall seconds; all methods serve the same tokens.
Peak KV: the engine's ``kv_peak_mb`` (cache pool + working buffers); for generate, the largest
DynamicCache it held. ``--roofline``: decode time per step against the memory-bandwidth limit (bytes
of weights + KV read per step, at the model's dtype / a numpy-measured read bandwidth).
Run:  OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/engine_bench.py --json r.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REACT_PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "alfworld" / "react" / "alfworld_3prompts.json"
SYSTEM_TEXT = ("<|im_start|>system\nYou are an agent in a household. Each turn you read what you observe and reply "
               "with one action, such as 'go to cabinet 1', 'open drawer 2', 'take mug 1 from desk 1', "
               "'put mug 1 in/on coffeemachine 1', or 'think: <a short plan>'.<|im_end|>\n")
USER = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
METHODS = ("engine", "hf_a", "hf_b", "llamacpp")
GGUF_TYPES = {"float32": "F32", "bfloat16": "BF16"}  # the GGUF tensor type that matches each --dtype
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_model(args):
    if args.model == "random":
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(args.seed)
        cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          num_key_value_heads=args.kv_heads, max_position_embeddings=args.max_pos,
                          eos_token_id=None, bos_token_id=None, pad_token_id=0)
        model = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():  # widen random logits so greedy choices are not near-ties
            model.lm_head.weight.mul_(20.0)
        model = model.to(DTYPES[args.dtype])
        model.generation_config.pad_token_id = 0
        model.generation_config.eos_token_id = None
        return model.eval(), None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from echo_rl.models.fetch import resolve_model

    path = resolve_model(args.model)
    if path is None:
        path = Path(args.model)
        if not path.is_dir():
            raise SystemExit(f"--model {args.model!r}: not a registered model (smollm2-135m), 'random', "
                             f"or a checkpoint directory")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[args.dtype]).eval()
    # Every method generates exactly --act-len tokens (the engine with stop_token_ids=()), so all serve
    # the same tokens: generate must not stop at EOS either.
    model.generation_config.pad_token_id = model.config.eos_token_id
    model.generation_config.eos_token_id = None
    return model, AutoTokenizer.from_pretrained(path)


def random_workload(args, vocab):
    g = torch.Generator().manual_seed(args.seed + 1)
    system = torch.randint(1, vocab, (args.system_len,), generator=g).tolist()
    lo, hi = max(1, args.obs_len - args.obs_len // 5), args.obs_len + args.obs_len // 5 + 1
    obs = [[torch.randint(1, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(args.turns)] for _ in range(args.episodes)]
    return system, obs


def alfworld_workload(args, tok):
    """System prompt + per-episode observation ids replayed from ALFWorld ReAct transcripts."""
    if not REACT_PROMPTS.exists():
        raise SystemExit(f"--workload alfworld needs {REACT_PROMPTS} (shared/data beside the checkout); "
                         f"use --workload random")
    transcripts = list(json.loads(REACT_PROMPTS.read_text()).values())
    system = tok.encode(SYSTEM_TEXT, add_special_tokens=False)
    obs = []
    for e in range(args.episodes):
        lines = [ln for ln in transcripts[e % len(transcripts)].strip().split("\n") if ln.strip()]
        first = "\n".join(lines[:2])  # the room, then "Your task is to: ..."
        env = [ln for ln in lines[2:] if not ln.startswith(">")]  # the environment's replies
        texts = [first] + [env[i % len(env)] for i in range(args.turns - 1)]
        obs.append([tok.encode(("" if t == 0 else "<|im_end|>\n") + USER.format(x), add_special_tokens=False)
                    for t, x in enumerate(texts)])
    return system, obs


MINIGRID_SYSTEM = ("<|im_start|>system\nYou are an agent in a grid world. Each turn you read what you see and reply "
                   "with one action: turn left, turn right, move forward, pick up, drop, toggle or done.<|im_end|>\n")


def minigrid_workload(args, tok):
    """System prompt + per-episode observation ids of MiniGrid-as-text episodes along the expert's path."""
    from echo_rl.environments.registry import make_env

    system = tok.encode(MINIGRID_SYSTEM, add_special_tokens=False)
    obs = []
    env = make_env(f"minigrid:{args.minigrid_env}", max_steps=args.turns + 1)
    for seed in range(1_000_000, 1_000_000 + 100 * args.episodes):  # evaluation seeds: training never draws them
        if len(obs) == args.episodes:
            break
        text, _ = env.reset(seed=seed)
        texts, done = [text], False
        while len(texts) < args.turns and not done:
            text, _, term, trunc, _ = env.step(env.expert_action())
            texts.append(text)
            done = term or trunc
        if len(texts) == args.turns:
            obs.append([tok.encode(("" if t == 0 else "<|im_end|>\n") + USER.format(x), add_special_tokens=False)
                        for t, x in enumerate(texts)])
    if len(obs) < args.episodes:
        raise SystemExit(f"--minigrid-env {args.minigrid_env}: too few seeds whose expert needs >= --turns "
                         f"{args.turns} steps; use a larger map or fewer turns")
    env.close()
    return system, obs


def count_tokens(system, obs, act_len):
    """Effective tokens of the whole workload: every turn's full prompt plus its action."""
    total = 0
    for ep in obs:
        hist = len(system)
        for o in ep:
            hist += len(o)
            total += hist + act_len
            hist += act_len
    return total


def kv_bytes_per_token(model) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    elem = next(model.parameters()).element_size()  # the engine's and generate's KV take the weights' dtype
    return 2 * c.num_hidden_layers * (c.num_key_value_heads or c.num_attention_heads) * head_dim * elem


def run_engine(model, system, obs, args):
    from echo_rl.core.async_execution import AsyncExecutionEngine, ExecutionConfig
    from echo_rl.lm.session import EpisodeSession

    cfg = ExecutionConfig(max_concurrent_rollouts=len(obs), max_batch_tokens=args.max_batch_tokens,
                          kv_memory_budget_mb=args.kv_budget_mb)
    actions = [[] for _ in obs]

    async def episode(eng, e):
        session = EpisodeSession(eng, e)  # the episode's history is the caller's; the engine serves each turn
        session.append(system, "template")
        for o in obs[e]:
            session.append(o)
            r = await session.generate(max_new_tokens=args.act_len, stop_token_ids=())
            actions[e].append(r.token_ids)

    async def main():
        async with AsyncExecutionEngine(cfg, model) as eng:
            eng.metrics.reset()
            t0, c0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*[episode(eng, e) for e in range(len(obs))])
            return time.perf_counter() - t0, time.process_time() - c0, eng.snapshot()

    wall, cpu, snap = asyncio.run(main())
    return wall, cpu, actions, snap


@torch.inference_mode()
def run_hf_a(model, system, obs, args):
    """Per turn: one batched generate over every episode's full history (left-padded), no cache kept."""
    pad = model.generation_config.pad_token_id or 0
    hist = [list(system) for _ in obs]
    actions = [[] for _ in obs]
    peak = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for t in range(len(obs[0])):
        for e in range(len(obs)):
            hist[e] += obs[e][t]
        width = max(len(h) for h in hist)
        ids = torch.full((len(hist), width), pad, dtype=torch.long)
        mask = torch.zeros(len(hist), width, dtype=torch.long)
        for e, h in enumerate(hist):
            ids[e, width - len(h):] = torch.tensor(h)
            mask[e, width - len(h):] = 1
        out = model.generate(ids, attention_mask=mask, max_new_tokens=args.act_len, do_sample=False)
        peak = max(peak, len(hist) * (width + args.act_len))
        for e in range(len(obs)):
            a = out[e, width:].tolist()
            actions[e].append(a)
            hist[e] += a
    return time.perf_counter() - t0, time.process_time() - c0, actions, {"kv_peak_tokens": peak}


@torch.inference_mode()
def run_hf_b(model, system, obs, args):
    """Per episode: generate with a DynamicCache carried from turn to turn (only new tokens computed)."""
    from transformers import DynamicCache

    actions = [[] for _ in obs]
    peak = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for e in range(len(obs)):
        hist = list(system)
        cache = DynamicCache(config=model.config)
        for o in obs[e]:
            hist += o
            ids = torch.tensor([hist])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache,
                                 max_new_tokens=args.act_len, do_sample=False)
            a = out[0, len(hist):].tolist()
            actions[e].append(a)
            hist += a
        peak = max(peak, len(hist))
    return time.perf_counter() - t0, time.process_time() - c0, actions, {"kv_peak_tokens": peak}


def run_llamacpp(model, system, obs, args):
    """Per episode, one turn after another on llama.cpp, its KV cache reused across turns and episodes."""
    llm = load_llamacpp(args)
    actions = [[] for _ in obs]
    peak = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for e in range(len(obs)):
        hist = list(system)
        for o in obs[e]:
            hist += o
            a = []
            for token in llm.generate(hist, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
                a.append(int(token))
                if len(a) == args.act_len:
                    break
            actions[e].append(a)
            hist += a
        peak = max(peak, len(hist))
    return time.perf_counter() - t0, time.process_time() - c0, actions, {"kv_peak_tokens": peak}


_LLAMA: dict = {}


def load_llamacpp(args):
    """One llama.cpp model per process (loading is not what is timed); its GGUF type must match --dtype."""
    if "llm" in _LLAMA:
        return _LLAMA["llm"]
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise SystemExit(f"--methods llamacpp needs llama-cpp-python ({exc}): pip install -e '.[bench]' "
                         "(builds llama.cpp from source, ~11 min on 2 cores)") from None
    if not args.gguf or not Path(args.gguf).is_file():
        raise SystemExit(f"--methods llamacpp needs --gguf FILE (got {args.gguf!r}): convert the checkpoint with "
                         "llama.cpp's convert_hf_to_gguf.py --outtype f32|bf16 (docs/benchmarks.md)")
    import gguf

    want = GGUF_TYPES[args.dtype]
    types = {gguf.GGMLQuantizationType(t.tensor_type).name for t in gguf.GGUFReader(args.gguf).tensors
             if t.name.endswith("attn_q.weight")}
    if types != {want}:  # checked before loading: a mismatched file costs nothing
        raise SystemExit(f"--gguf {args.gguf}: its attention weights are {sorted(types)}, not {want} (--dtype "
                         f"{args.dtype}): convert with --outtype {want.lower()} so both sides compute at the same "
                         "precision")
    kv = int(getattr(gguf.GGMLQuantizationType, want))  # its KV cache at the run's precision too
    llm = Llama(model_path=args.gguf, n_ctx=args.llamacpp_ctx, n_batch=args.max_batch_tokens,
                n_threads=args.threads, n_threads_batch=args.threads, type_k=kv, type_v=kv, verbose=False)
    _LLAMA["llm"] = llm
    return llm


def agreement(x, y):
    """Fraction of actions (per episode and turn) that are identical."""
    pairs = [(a, b) for ea, eb in zip(x, y) for a, b in zip(ea, eb)]
    return sum(a == b for a, b in pairs) / max(len(pairs), 1)


def token_agreement(x, y):
    """Fraction of generated tokens equal position by position (after a first difference, later tokens
    of that action and later turns' contexts differ too: greedy continues from its own choice)."""
    pairs = [(a, b) for ea, eb in zip(x, y) for a, b in zip(ea, eb)]
    same = sum(s == t for a, b in pairs for s, t in zip(a, b))
    total = sum(min(len(a), len(b)) for a, b in pairs)
    return same / max(total, 1)


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "reps": xs}


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def read_bandwidth() -> float:
    """Best-of-5 bytes/s of summing a 256 MiB float64 array (reads only), numpy, this process's threads."""
    import numpy as np

    a = np.ones(32 * 2**20)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        a.sum()
        best = max(best, a.nbytes / (time.perf_counter() - t))
    return best


@torch.inference_mode()
def roofline(model, args) -> dict:
    """Decode step time of the engine's runner vs the bandwidth limit: weights + every sequence's KV read once."""
    from echo_rl.engine.model_runner import PackedModelRunner, Segment

    runner = PackedModelRunner(model)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bpt = kv_bytes_per_token(model)
    bw = read_bandwidth()
    out = {"read_bandwidth_gb_s": bw / 1e9, "weight_bytes": weight_bytes, "kv_bytes_per_token": bpt, "cases": []}
    g = torch.Generator().manual_seed(0)
    for batch in (1, args.episodes):
        kvs = []
        for _ in range(batch):
            kv = runner.new_kv(args.roofline_context + 8)
            ids = torch.randint(0, runner.vocab_size, (args.roofline_context,), generator=g).tolist()
            runner.forward([Segment(kv, ids)])
            kvs.append(kv)
        steps = []
        for _ in range(6):
            segs = [Segment(kv, [1], need_logits=True) for kv in kvs]
            t = time.perf_counter()
            runner.forward(segs)
            steps.append(time.perf_counter() - t)
        step = statistics.median(steps[1:])
        read = weight_bytes + sum(kv.length for kv in kvs) * bpt
        limit = read / bw
        case = {"batch": batch, "context": args.roofline_context, "step_s": step, "bytes_read": read,
                "bandwidth_limit_s": limit, "fraction_of_limit": limit / step, "tokens_per_s": batch / step}
        out["cases"].append(case)
        print(f"roofline: batch {batch}, context {args.roofline_context}: decode step {step * 1e3:.1f} ms, reads "
              f"{read / 2**20:.0f} MiB -> limit {limit * 1e3:.1f} ms at {bw / 1e9:.1f} GB/s: "
              f"{limit / step:.1%} of the bandwidth limit, {batch / step:.0f} tok/s")
    return out


def attention_layouts(model, args) -> dict:
    """CPU time of one decode step's attention over all layers, ``--episodes`` sequences at --roofline-context.

    The measurement behind the engine's working-KV layout (docs/engine.md): ``loop`` = per sequence ``bmm``
    over its own contiguous head-major KV, in place (what the engine does in float32; with bf16 weights it
    does ``loop_fp32_math``: the same over bf16 KV upcast per call); ``pool_gather_sdpa`` = KV in one
    shared token pool (paged, prefix blocks shared), gathered each step into a padded batch for one SDPA
    call per layer; ``block_gather_sdpa`` = the same with 32-token blocks; ``padded_rect_bmm`` = all
    sequences in one preallocated rectangle, one strided ``baddbmm`` per layer with a length mask.
    """
    import torch.nn.functional as F

    c = model.config
    L, H, KV = c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads
    D = getattr(c, "head_dim", None) or c.hidden_size // H
    B, ctx, G = args.episodes, args.roofline_context, H // KV
    cap, bs = ctx + 64, 32
    g = torch.Generator().manual_seed(0)
    lens = [ctx - 4 * i for i in range(B)]
    maxl = max(lens)
    dt = next(model.parameters()).dtype  # the engine's working KV takes the weights' dtype
    seqs = [torch.randn(L, 2, KV, cap, D, generator=g).to(dt) for _ in range(B)]
    q = torch.randn(B, H, D, generator=g).to(dt)
    pool = torch.randn(L, 2, KV, B * cap, D, generator=g).to(dt)
    idx = torch.cat([torch.arange(i * cap, i * cap + maxl) for i in range(B)])
    mask = torch.stack([torch.arange(maxl) < n for n in lens])[:, None, None]
    nb, per = -(-maxl // bs), -(-cap // bs)
    blocks = torch.randn(L, 2, KV, B * per, bs, D, generator=g).to(dt)
    bidx = torch.cat([torch.arange(i * per, i * per + nb) for i in range(B)])
    bmask = torch.stack([torch.arange(nb * bs) < n for n in lens])[:, None, None]
    rect = torch.randn(L, 2, B * KV, cap, D, generator=g).to(dt)
    bias = torch.zeros(B, KV, 1, maxl, dtype=dt)
    for i, n in enumerate(lens):
        bias[i, :, :, n:] = float("-inf")
    bias = bias.view(B * KV, 1, maxl)

    def loop():
        for li in range(L):
            torch.cat([torch.bmm(torch.softmax(torch.bmm(q[i].view(KV, G, D), seqs[i][li, 0, :, :n].transpose(1, 2)),
                                               -1), seqs[i][li, 1, :, :n]).view(1, -1) for i, n in enumerate(lens)])

    def loop_fp32_math():  # the engine with bf16 weights: bf16 KV, scores and softmax in float32
        for li in range(L):
            torch.cat([torch.bmm(torch.softmax(torch.bmm(q[i].view(KV, G, D).float(),
                                                         seqs[i][li, 0, :, :n].float().transpose(1, 2)), -1),
                                 seqs[i][li, 1, :, :n].float()).view(1, -1).to(dt) for i, n in enumerate(lens)])

    def pool_gather_sdpa():
        for li in range(L):
            kv = pool[li].index_select(2, idx).view(2, KV, B, maxl, D).transpose(1, 2)
            F.scaled_dot_product_attention(q[:, :, None], kv[0], kv[1], attn_mask=mask, enable_gqa=True)

    def block_gather_sdpa():
        for li in range(L):
            kv = blocks[li].index_select(2, bidx).view(2, KV, B, nb * bs, D).transpose(1, 2)
            F.scaled_dot_product_attention(q[:, :, None], kv[0], kv[1], attn_mask=bmask, enable_gqa=True)

    def padded_rect_bmm():
        for li in range(L):
            s = torch.baddbmm(bias, q.view(B * KV, G, D), rect[li, 0, :, :maxl].transpose(1, 2))
            torch.bmm(torch.softmax(s, -1), rect[li, 1, :, :maxl])

    out = {}
    fns = (loop, pool_gather_sdpa, block_gather_sdpa, padded_rect_bmm)
    for f in fns if dt == torch.float32 else (loop, loop_fp32_math) + fns[1:]:
        f()
        c0 = time.process_time()
        for _ in range(5):
            f()
        out[f.__name__] = (time.process_time() - c0) / 5 * 1e3
        print(f"attention {f.__name__}: {out[f.__name__]:.1f} ms CPU per decode step ({L} layers, {B} sequences, "
              f"context ~{ctx})")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m, a checkpoint dir, or 'random'")
    p.add_argument("--minigrid-env", default="MiniGrid-DoorKey-8x8-v0", help="--workload minigrid: the env id")
    p.add_argument("--workload", default=None, choices=("alfworld", "minigrid", "random"),
                   help="default: alfworld on a real model, random on --model random")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--act-len", type=int, default=16)
    p.add_argument("--obs-len", type=int, default=40, help="random workload: observation length")
    p.add_argument("--system-len", type=int, default=64, help="random workload: system prompt length")
    p.add_argument("--vocab", type=int, default=4096, help="random model")
    p.add_argument("--hidden", type=int, default=256, help="random model")
    p.add_argument("--layers", type=int, default=4, help="random model")
    p.add_argument("--heads", type=int, default=4, help="random model")
    p.add_argument("--kv-heads", type=int, default=2, help="random model")
    p.add_argument("--max-pos", type=int, default=2048, help="random model")
    p.add_argument("--max-batch-tokens", type=int, default=1024)
    p.add_argument("--kv-budget-mb", type=float, default=1024.0, help="ExecutionConfig.kv_memory_budget_mb")
    p.add_argument("--reps", type=int, default=2, help="timed repetitions (method order reversed every other)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads (1: on a shared, oversubscribed box 2 OpenMP threads stall)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=tuple(DTYPES),
                   help="weights and KV of every method (engine and both generate anchors)")
    p.add_argument("--methods", default="engine,hf_a,hf_b",
                   help=f"comma-separated, of {', '.join(METHODS)} (llamacpp needs --gguf and the bench extra)")
    p.add_argument("--roofline", action="store_true", help="also time decode steps against the bandwidth limit")
    p.add_argument("--roofline-context", type=int, default=400)
    p.add_argument("--attention-layouts", action="store_true",
                   help="only time decode attention per KV layout (the engine's design measurement)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--gguf", default=None, help="llamacpp: the checkpoint as GGUF at the run's precision")
    p.add_argument("--llamacpp-ctx", type=int, default=4096, help="llamacpp: context (KV) size")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    bad = [m for m in methods if m not in METHODS]
    if bad:
        p.error(f"--methods: unknown {bad[0]!r}; allowed: {', '.join(METHODS)}")
    if args.episodes < 1 or args.turns < 1 or args.act_len < 1 or args.reps < 1:
        p.error("--episodes, --turns, --act-len and --reps must be >= 1")

    model, tok = build_model(args)
    if args.attention_layouts:
        res = attention_layouts(model, args)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(res, fh, indent=1)
        return 0
    workload = args.workload or ("random" if tok is None else "alfworld")
    if workload in ("alfworld", "minigrid") and tok is None:
        p.error(f"--workload {workload} needs a real model (its tokenizer); allowed with --model random: random")
    system, obs = (alfworld_workload(args, tok) if workload == "alfworld" else minigrid_workload(args, tok)
                   if workload == "minigrid" else random_workload(args, model.config.vocab_size))
    effective = count_tokens(system, obs, args.act_len)
    params = sum(q.numel() for q in model.parameters())
    bpt = kv_bytes_per_token(model)
    print(f"model: {args.model} ({params / 1e6:.1f}M params, {args.dtype}), torch threads {torch.get_num_threads()}, "
          f"{platform.processor() or platform.machine()}, load {load()}")
    print(f"workload: {workload}, {args.episodes} episodes x {args.turns} turns, act {args.act_len}, system "
          f"{len(system)} tokens, observations {min(map(len, sum(obs, [])))}-{max(map(len, sum(obs, [])))} "
          f"tokens; effective tokens {effective}")
    res: dict = {"args": vars(args), "dtype": args.dtype, "workload": workload, "effective_tokens": effective, "params": params,
                 "kv_bytes_per_token": bpt, "runs": []}
    fns = {"engine": run_engine, "hf_a": run_hf_a, "hf_b": run_hf_b, "llamacpp": run_llamacpp}
    warm_sys, warm_obs = system, [ep[:2] for ep in obs[:2]]
    for m in methods:  # warm-up: allocator, kernels, first-call paths of every method
        fns[m](model, warm_sys, warm_obs, args)
    acts: dict = {}
    for rep in range(args.reps):
        order = methods if rep % 2 == 0 else methods[::-1]
        for m in order:
            before = load()
            wall, cpu, acts[m], extra = fns[m](model, system, obs, args)
            row = {"rep": rep, "method": m, "wall_s": wall, "cpu_s": cpu, "etps": effective / wall,
                   "load_before": before, "load_after": load()}
            if m == "engine":
                row.update({k: extra[k] for k in (
                    "kv_reuse_rate", "computed_tokens", "computed_tokens_per_s", "steps", "sequences_per_step",
                    "tokens_per_step", "kv_peak_mb", "memory_waits", "queue_time_mean")})
                assert extra["effective_tokens"] == effective, (extra["effective_tokens"], effective)
            else:
                row["kv_peak_mb"] = extra["kv_peak_tokens"] * bpt / 2**20
            res["runs"].append(row)
            more = (f"  KV reuse {row['kv_reuse_rate']:.3f}  computed {row['computed_tokens']:.0f}  "
                    f"seqs/step {row['sequences_per_step']:.1f}" if m == "engine" else "")
            print(f"rep {rep} {m}: {wall:.2f}s (cpu {cpu:.2f}s)  ETPS {effective / wall:.0f}  peak KV "
                  f"{row['kv_peak_mb']:.1f} MiB{more}  load {before} -> {row['load_after']}", flush=True)
    if "engine" in acts:
        for name in ("hf_a", "hf_b", "llamacpp"):
            if name not in acts:
                continue
            eng = {r["rep"]: r for r in res["runs"] if r["method"] == "engine"}
            ref = {r["rep"]: r for r in res["runs"] if r["method"] == name}
            wall = [ref[k]["wall_s"] / eng[k]["wall_s"] for k in sorted(eng)]
            cpu = [ref[k]["cpu_s"] / eng[k]["cpu_s"] for k in sorted(eng)]
            agree = agreement(acts["engine"], acts[name])
            tok_agree = token_agreement(acts["engine"], acts[name])
            res[f"etps_ratio_vs_{name}"] = spread(wall)
            res[f"cpu_ratio_vs_{name}"] = spread(cpu)
            res[f"action_agreement_vs_{name}"] = agree
            res[f"token_agreement_vs_{name}"] = tok_agree
            first = token_agreement([ep[:1] for ep in acts["engine"]], [ep[:1] for ep in acts[name]])
            res[f"first_turn_token_agreement_vs_{name}"] = first
            print(f"ETPS engine / {name}: median {statistics.median(wall):.2f}x [{min(wall):.2f}, {max(wall):.2f}] "
                  f"over {len(wall)} reps (per CPU second: {statistics.median(cpu):.2f}x "
                  f"[{min(cpu):.2f}, {max(cpu):.2f}]); greedy actions identical: {agree:.1%}, tokens {tok_agree:.1%} "
                  f"(first turn, same prompts for all: {first:.1%})")
    if "hf_a" in acts and "hf_b" in acts:  # the anchors against each other: generate's own batching/cache noise
        res["token_agreement_hf_a_vs_hf_b"] = token_agreement(acts["hf_a"], acts["hf_b"])
        res["first_turn_token_agreement_hf_a_vs_hf_b"] = token_agreement([ep[:1] for ep in acts["hf_a"]],
                                                                          [ep[:1] for ep in acts["hf_b"]])
        print(f"greedy tokens hf_a vs hf_b: {res['token_agreement_hf_a_vs_hf_b']:.1%} (first turn "
              f"{res['first_turn_token_agreement_hf_a_vs_hf_b']:.1%})")
    if "llm" in _LLAMA:  # freed here: llama-cpp-python's own finaliser fails at interpreter exit
        _LLAMA.pop("llm").close()
    if args.roofline:
        res["roofline"] = roofline(model, args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

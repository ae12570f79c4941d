"""One packed forward over many sequences at once, on a transformers Llama/Qwen model.

Why not call the model's own ``forward``: transformers batches by padding to a
rectangle and keeps one cache per batch, so sequences cannot join or leave
between steps, and a mixed step (a 40-token prefill chunk beside 31 one-token
decodes) pads every row to 40. Here every token of the step is one row of a
packed ``[tokens, hidden]`` matrix: the norms, projections, MLP and LM head run
once for the whole step, and only attention is done per sequence, over that
sequence's contiguous working KV. The weights, norms and rotary embedding are
the model's own modules, so the arithmetic is the model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


class SequenceKV:
    """Working K/V of one in-flight sequence: ``[layers, 2, kv_heads, capacity, dim]``.

    Allocated once at admission with room for prompt + plan + max_new_tokens,
    so decoding never reallocates, and each (layer, head) is one contiguous
    ``[positions, dim]`` matrix that attention reads in place (a row-per-token
    layout made decode attention 1.8-2.9x slower on this CPU; docs/engine.md).
    The cache pool stores rows per token; :meth:`load_rows` / :meth:`rows`
    convert once per request, not once per step.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.buf = torch.empty(num_layers, 2, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.length = 0  # positions whose KV is filled in

    @property
    def capacity(self) -> int:
        return int(self.buf.shape[3])

    @property
    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()

    def load_rows(self, rows: torch.Tensor) -> None:
        """Fill positions ``0..n`` from pool rows ``[n, 2, layers, kv_heads, dim]``."""
        n = rows.shape[0]
        self.buf[:, :, :, :n].copy_(rows.permute(2, 1, 3, 0, 4))
        self.length = n

    def rows(self, n: int) -> torch.Tensor:
        """Positions ``0..n`` as pool rows ``[n, 2, layers, kv_heads, dim]`` (a view)."""
        return self.buf[:, :, :, :n].permute(3, 1, 0, 2, 4)


@dataclass
class Segment:
    """The inputs one sequence contributes to a step: token ids, then soft-prefix rows."""

    kv: SequenceKV
    token_ids: list[int]
    embeds: torch.Tensor | None = None  # [n, hidden]: latent-plan rows after the tokens
    need_logits: bool = False

    @property
    def num_inputs(self) -> int:
        return len(self.token_ids) + (0 if self.embeds is None else int(self.embeds.shape[0]))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def check_supported(model) -> None:
    """Raise a clear error for models this runner cannot execute exactly."""
    cfg = getattr(model, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(
            f"model_type={mtype!r} is not supported by the local engine; allowed: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (use the vLLM backend for other architectures)")
    layer_types = getattr(cfg, "layer_types", None) or []
    if "sliding_attention" in layer_types or getattr(cfg, "use_sliding_window", False):
        raise NotImplementedError("sliding-window attention is not supported by the local engine")
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(model.model, name):
            raise NotImplementedError(f"model.model.{name} is missing: not a Llama/Qwen-style decoder")


class PackedModelRunner:
    """Runs steps of packed segments through a Llama/Qwen causal LM."""

    def __init__(self, model):
        check_supported(model)
        self.model = model.eval()
        cfg = model.config
        self.config = cfg
        self.layers = list(model.model.layers)
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(cfg.num_key_value_heads or cfg.num_attention_heads)
        self.scaling = float(attn.scaling)
        self.hidden_size = int(cfg.hidden_size)
        self.vocab_size = int(cfg.vocab_size)
        self.max_context = int(cfg.max_position_embeddings)
        self.has_qk_norm = hasattr(attn, "q_norm")
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self.attn_upcast = self.dtype in (torch.bfloat16, torch.float16)  # see _attend

    def new_kv(self, capacity: int) -> SequenceKV:
        return SequenceKV(len(self.layers), self.num_kv_heads, capacity, self.head_dim, self.dtype, self.device)

    def embed(self, token_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        return self.model.model.embed_tokens(ids)

    def _attend(self, buf: torch.Tensor, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                start: int, mask: torch.Tensor | None) -> torch.Tensor:
        """Write this chunk's K/V at ``start`` and attend its (pre-scaled) queries ``[n, heads, dim]`` causally.

        Grouped-query heads are folded into the query rows (``[kv_heads, groups*n, dim]``)
        so each KV head is read once, straight from the buffer. With reduced-precision weights
        (bfloat16) the KV is stored in that dtype but attention is computed in float32: CPU ``bmm``
        in bf16 copies a strided KV view before multiplying, and its upcast copy costs the same,
        so float32 scores and softmax come at no extra cost (0.61x the bf16 time per decode
        attention call measured; docs/engine.md "Precision").
        """
        n, end = q.shape[0], start + q.shape[0]
        buf[layer, 0, :, start:end] = k.transpose(0, 1)
        buf[layer, 1, :, start:end] = v.transpose(0, 1)
        keys = buf[layer, 0, :, :end]  # [kv_heads, end, dim], a view
        vals = buf[layer, 1, :, :end]
        if self.attn_upcast:
            q, keys, vals = q.float(), keys.float(), vals.float()
        groups = self.num_heads // self.num_kv_heads
        if n == 1:  # decode: the heads already sit as [kv_heads, groups, dim]; no reshuffle
            scores = torch.bmm(q.view(self.num_kv_heads, groups, self.head_dim), keys.transpose(1, 2))
            out = torch.bmm(torch.softmax(scores, dim=-1), vals).view(1, -1)
            return out.to(self.dtype) if self.attn_upcast else out
        qg = q.view(n, self.num_kv_heads, groups, self.head_dim).permute(1, 2, 0, 3)
        qg = qg.reshape(self.num_kv_heads, groups * n, self.head_dim)
        scores = torch.bmm(qg, keys.transpose(1, 2))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.bmm(torch.softmax(scores, dim=-1), vals)  # [kv_heads, groups*n, dim]
        out = out.view(self.num_kv_heads, groups, n, self.head_dim).permute(2, 0, 1, 3).reshape(n, -1)
        return out.to(self.dtype) if self.attn_upcast else out

    @torch.inference_mode()
    def forward_isolating(self, segments: list[Segment]) -> tuple[dict[int, torch.Tensor], dict[int, Exception]]:
        """:meth:`forward` with faults contained: logits by segment index (those that need logits) and the
        error of every segment whose own forward failed.

        If the packed forward raises, each segment is run alone (the forward only advances ``kv.length``
        after success, and segments share no rows outside attention), so only the segments whose own
        forward fails are reported; a fault of the model itself fails them all.
        """
        try:
            logits = self.forward(segments)
        except Exception:
            out, errors = {}, {}
            for i, seg in enumerate(segments):
                try:
                    row = self.forward([seg])
                except Exception as exc:
                    errors[i] = exc
                    continue
                if seg.need_logits:
                    out[i] = row[0]
            return out, errors
        need = [i for i, seg in enumerate(segments) if seg.need_logits]
        return {i: logits[k] for k, i in enumerate(need)}, {}

    def forward(self, segments: list[Segment]) -> torch.Tensor:
        """Append every segment's KV and return float32 logits at each ``need_logits`` segment's last row."""
        if not segments:
            raise ValueError("forward needs at least one segment")
        all_ids = [t for s in segments for t in s.token_ids]
        tok = self.embed(all_ids) if all_ids else None
        parts, positions, off = [], [], 0
        for s in segments:
            n_tok = len(s.token_ids)
            if n_tok:
                parts.append(tok[off: off + n_tok])
                off += n_tok
            if s.embeds is not None:
                parts.append(s.embeds.to(self.dtype))
            start = s.kv.length
            if start + s.num_inputs > s.kv.capacity:
                raise RuntimeError(f"sequence KV overflow: {start}+{s.num_inputs} > {s.kv.capacity}")
            positions.append(torch.arange(start, start + s.num_inputs, device=self.device))
        x = torch.cat(parts) if len(parts) > 1 else parts[0]
        pos = torch.cat(positions)
        cos, sin = self.model.model.rotary_emb(x[None], pos[None])
        cos, sin = cos[0][:, None, :], sin[0][:, None, :]
        n_all = x.shape[0]
        spans = []
        o = 0
        for s in segments:
            spans.append((o, s.num_inputs, s.kv.length))
            o += s.num_inputs
        masks = {}
        for _, n, start in spans:
            if n > 1 and (n, start) not in masks:
                q_pos = torch.arange(start, start + n, device=self.device)[:, None]
                allowed = torch.arange(start + n, device=self.device)[None, :] <= q_pos
                masks[(n, start)] = allowed.repeat(self.num_heads // self.num_kv_heads, 1)
        for li, layer in enumerate(self.layers):
            att = layer.self_attn
            h = layer.input_layernorm(x)
            q = att.q_proj(h).view(n_all, self.num_heads, self.head_dim)
            k = att.k_proj(h).view(n_all, self.num_kv_heads, self.head_dim)
            v = att.v_proj(h).view(n_all, self.num_kv_heads, self.head_dim)
            if self.has_qk_norm:
                q, k = att.q_norm(q), att.k_norm(k)
            q = (q * cos + _rotate_half(q) * sin) * self.scaling  # scale once for every sequence
            k = k * cos + _rotate_half(k) * sin
            outs = [self._attend(s.kv.buf, li, q[o: o + n], k[o: o + n], v[o: o + n], start,
                                 masks.get((n, start))) for s, (o, n, start) in zip(segments, spans)]
            a = torch.cat(outs) if len(outs) > 1 else outs[0]
            x = x + att.o_proj(a)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        for s in segments:
            s.kv.length += s.num_inputs
        rows = [o + n - 1 for s, (o, n, _) in zip(segments, spans) if s.need_logits]
        if not rows:
            return torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device)
        last = self.model.model.norm(x[torch.tensor(rows, device=self.device)])
        return self.model.lm_head(last).float()

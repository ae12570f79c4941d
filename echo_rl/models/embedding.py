"""An ``nn.Embedding`` with a faster CPU backward, equal bit for bit to torch's.

MiniGrid's symbolic encoder embeds 147 image indices per observation, so a minibatch of 256 has
~38k indices, and torch's CPU embedding backward loops over them one scalar ``axpy`` at a time.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class _IndexAddEmbeddingFn(torch.autograd.Function):
    """``F.embedding`` whose weight gradient is one ``index_add_``.

    Why: on CPU, torch's dense embedding backward for more than 3,000 indices loops over every
    index once per row range with a scalar ``axpy`` of the embedding width (8 here); a PPO
    minibatch's trunk has 256 x 147 image indices, and that loop took ~7% of an EchoRL
    iteration. Up to 3,000 indices torch itself takes ``index_add_``, which adds each row's
    gradients in index order exactly as that loop does, so the gradient is bit-identical.
    """

    @staticmethod
    def forward(ctx, indices: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.num_weights = weight.shape[0]
        return F.embedding(indices, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (indices,) = ctx.saved_tensors
        width = grad.shape[-1]
        grad_weight = grad.new_zeros(ctx.num_weights, width)
        return None, grad_weight.index_add_(0, indices.reshape(-1), grad.reshape(-1, width))


class IndexAddEmbedding(nn.Embedding):
    """An ``nn.Embedding`` (same weight, same forward) with :class:`_IndexAddEmbeddingFn`'s backward;
    the options that backward does not cover (padding_idx, max_norm, scale_grad_by_freq, sparse) use torch's."""

    @classmethod
    def wrap(cls, embed: nn.Embedding) -> "IndexAddEmbedding":
        """The same weight Parameter under this class (no fresh init: the caller's RNG draws stay as they were)."""
        wrapped = cls(embed.num_embeddings, embed.embedding_dim, embed.padding_idx, embed.max_norm, embed.norm_type,
                      embed.scale_grad_by_freq, embed.sparse, _weight=embed.weight.detach())
        wrapped.weight = embed.weight  # the Parameter itself, so whoever holds it (an optimiser) still does
        return wrapped

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        if self.padding_idx is not None or self.max_norm is not None or self.scale_grad_by_freq or self.sparse \
                or not torch.is_grad_enabled() or not self.weight.requires_grad or self.weight.device.type != "cpu":
            return super().forward(indices)
        return _IndexAddEmbeddingFn.apply(indices, self.weight)

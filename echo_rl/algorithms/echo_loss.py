"""The ECHO objective (Shrivastava et al. 2026): GRPO on action tokens + λ · CE on env-output tokens.

    L = L_GRPO(θ; A) + λ · L_env,   L_env = mean_i [ -(1/|O_i|) Σ_{t ∈ O'_i} log p_θ(x_t | x_<t) ]

Both terms read the same logits (one forward pass) through different role
masks. The CE is taken at temperature 1 whatever temperature the policy
term uses, and needs no behaviour log-probs, so clipping, ratios and KL stay
on action tokens. |O_i| counts warning + env-output body tokens while the
default target O' holds env output only (warnings are easy and stop
teaching fast). The CE does not depend on advantages: a group whose
rewards are all equal still trains the world model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from echo_rl.algorithms.grpo import grpo_loss
from echo_rl.algorithms.token_logprobs import action_mask, ce_mask, response_mask, sequence_logprobs
from echo_rl.types import ENV_OUTPUT, WARNING

NORMALIZATIONS = ("sequence", "token_mean")
SCHEDULES = ("constant", "linear_decay", "step_decay")


@dataclass(frozen=True)
class LambdaSchedule:
    """λ by learner step: ``constant`` (the paper), ``linear_decay`` to ``end`` over ``steps``,
    or ``step_decay`` multiplying by ``factor`` every ``steps`` steps."""

    value: float = 0.05
    kind: str = "constant"
    steps: int = 1000
    end: float = 0.0
    factor: float = 0.5

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"lambda schedule kind={self.kind!r} is invalid: allowed: {', '.join(SCHEDULES)}")
        if self.value < 0 or self.end < 0:
            raise ValueError(f"lambda value={self.value}, end={self.end} are invalid: must be >= 0")
        if self.steps < 1:
            raise ValueError(f"lambda schedule steps={self.steps} is invalid: must be >= 1")
        if not 0 < self.factor <= 1:
            raise ValueError(f"lambda schedule factor={self.factor} is invalid: must be in (0, 1]")

    def __call__(self, step: int) -> float:
        if self.kind == "constant":
            return self.value
        if self.kind == "linear_decay":
            frac = min(max(step, 0) / self.steps, 1.0)
            return self.value + (self.end - self.value) * frac
        return self.value * self.factor ** (max(step, 0) // self.steps)


def env_ce_loss(logprobs: torch.Tensor, target_mask: torch.Tensor, env_output_count: torch.Tensor, *,
                normalization: str = "sequence", eps: float = 1e-3,
                weights: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy on the target tokens.

    ``sequence`` (paper Eq. 3): per row ``Σ CE / (|O_i| + eps)``, averaged over
    all rows of the batch; ``token_mean``: ``Σ CE / (selected tokens + eps)``
    over the batch. Without selected tokens the result is a graph-connected 0.
    """
    ce = -logprobs * target_mask
    if weights is not None:  # per-trajectory importance weights
        ce = ce * weights.to(ce.dtype).unsqueeze(1)
    if normalization == "sequence":
        return (ce.sum(1) / (env_output_count.to(ce.dtype) + eps)).mean()
    if normalization == "token_mean":
        return ce.sum() / (target_mask.sum() + eps)
    raise ValueError(f"ce_normalization={normalization!r} is invalid: allowed: {', '.join(NORMALIZATIONS)}")


@dataclass
class EchoLossTerms:
    loss: torch.Tensor
    pg_loss: torch.Tensor
    env_ce: torch.Tensor   # unscaled L_env (its normalisation)
    kl: torch.Tensor
    lam: float
    metrics: dict[str, float] = field(default_factory=dict)
    row_env_ce: torch.Tensor | None = None  # [B] detached token-mean CE of each row's target tokens (replay priorities)


def echo_loss(logits: torch.Tensor, input_ids: torch.Tensor, roles: torch.Tensor, prompt_length: torch.Tensor,
              behavior_logprobs: torch.Tensor, advantages: torch.Tensor, env_output_count: torch.Tensor, *,
              lam: float = 0.05, attention_mask: torch.Tensor | None = None, ce_target: str = "env_only",
              ce_normalization: str = "sequence", pg_temperature: float = 1.0, clip_low: float = 0.2,
              clip_high: float = 0.2, ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
              pg_reduction: str = "token_mean", weights: torch.Tensor | None = None) -> EchoLossTerms:
    """GRPO + λ·env CE from one forward pass's ``logits`` ``[B, L, V]``; λ = 0 is exactly :func:`grpo_loss`.

    ``roles``/``behavior_logprobs`` are ``[B, L]`` aligned with ``input_ids``;
    ``prompt_length``, ``env_output_count`` and ``advantages`` are ``[B]``; ``weights`` ``[B]`` are
    optional importance weights of replayed trajectories, applied to both terms.
    """
    lp_pg = sequence_logprobs(logits, input_ids, pg_temperature)
    lp_ce = lp_pg if pg_temperature == 1.0 else sequence_logprobs(logits, input_ids, 1.0)
    return echo_loss_from_logprobs(lp_pg, lp_ce, roles, prompt_length, behavior_logprobs, advantages,
                                   env_output_count, lam=lam, attention_mask=attention_mask, ce_target=ce_target,
                                   ce_normalization=ce_normalization, clip_low=clip_low, clip_high=clip_high,
                                   ref_logprobs=ref_logprobs, kl_coef=kl_coef, pg_reduction=pg_reduction,
                                   weights=weights)


def echo_loss_from_logprobs(lp_pg: torch.Tensor, lp_ce: torch.Tensor, roles: torch.Tensor,
                            prompt_length: torch.Tensor, behavior_logprobs: torch.Tensor, advantages: torch.Tensor,
                            env_output_count: torch.Tensor, *, lam: float = 0.05,
                            attention_mask: torch.Tensor | None = None, ce_target: str = "env_only",
                            ce_normalization: str = "sequence", clip_low: float = 0.2, clip_high: float = 0.2,
                            ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                            pg_reduction: str = "token_mean", weights: torch.Tensor | None = None) -> EchoLossTerms:
    """:func:`echo_loss` from per-token log-probs ``[B, L]`` (at the rollout temperature for the policy term,
    at 1 for the CE) — what the learner's chunked head gives; only action and observation-body positions
    are read."""
    if lam < 0:
        raise ValueError(f"lam={lam} is invalid: must be >= 0")
    resp = response_mask(prompt_length, roles.shape[1], attention_mask)
    acts = action_mask(roles, resp)
    pg = grpo_loss(lp_pg, behavior_logprobs, advantages, acts, clip_low=clip_low, clip_high=clip_high,
                   ref_logprobs=ref_logprobs, kl_coef=kl_coef, reduction=pg_reduction, weights=weights)
    target = ce_mask(roles, resp, ce_target)
    env_ce = env_ce_loss(lp_ce, target, env_output_count, normalization=ce_normalization, weights=weights)
    loss = pg.loss + lam * env_ce if lam else pg.loss
    with torch.no_grad():
        metrics = {"pg_loss": float(pg.pg_loss), "env_ce": float(env_ce), "env_ce_scaled": float(lam * env_ce),
                   "lambda": float(lam), "kl": float(pg.kl), "clip_fraction": float(pg.clip_fraction),
                   "ratio_mean": float(pg.ratio_mean), "tokens_action": float(pg.action_tokens),
                   "tokens_ce_target": float(target.sum()), "env_output_count": float(env_output_count.sum()),
                   "ce_zero_tokens": float(target.sum() == 0)}
        for name, code in (("env_output", ENV_OUTPUT), ("warning", WARNING)):
            m = (roles == code).float() * resp
            metrics[f"tokens_{name}"] = float(m.sum())
            metrics[f"ce_token_mean_{name}"] = float((-lp_ce * m).sum() / m.sum().clamp(min=1))
        pg_abs = float(pg.pg_loss.abs())
        metrics["ce_pg_ratio"] = float(lam * env_ce) / pg_abs if pg_abs > 0 else float("nan")
        row_ce = (-lp_ce * target).sum(1) / target.sum(1).clamp(min=1)
    return EchoLossTerms(loss, pg.pg_loss, env_ce, pg.kl, float(lam), metrics, row_ce)

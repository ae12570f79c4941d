"""Latent planning: a plan tau_t = F_phi(s_{t-k+1:t}) conditions the policy pi(a | s, tau).

The encoder reads a window of the last k states and returns a diagonal Gaussian
p_phi(tau_t | s_1:t). The policy conditions on a reparameterised sample
tau = mu + sigma * eps, with eps drawn by the actor and stored, so the learner
recomputes exactly the plan the actor used (importance ratios stay exact) while
gradients still reach the encoder. A KL term keeps consecutive plans close:
``L_KL = KL[p(tau_t | s_1:t) || p(tau_{t-1} | s_1:t-1)]``, counted only where t
and t-1 lie in the same episode.

Episode boundaries: a window carries a validity mask; states of an earlier
episode are zeroed *before* any computation, so they cannot leak into a plan.

Conditioning (FiLM, a "soft prefix" for an MLP): the plan produces a per-unit
scale and shift of the policy trunk, ``h' = h * (1 + a*g(tau)) + a*b(tau)``
with ``a = soft_prefix_alpha``. ``a = 0`` removes the plan's influence exactly,
which is the "no plan" ablation; for a language model the same plan becomes
soft-prefix embeddings scaled by ``a``.

Parts: :mod:`distribution` (the Gaussian plan and its KLs), :mod:`encoder` (``TrajectoryEncoder``,
``StateWindow``), :mod:`policy` (``PolicyNetwork``), :mod:`optimizer` (``LatentPlanningOptimizer``).
"""

from echo_rl.planning.distribution import PlanDistribution, consecutive_plan_kl, gaussian_kl
from echo_rl.planning.encoder import StateWindow, TrajectoryEncoder
from echo_rl.planning.optimizer import LatentPlanningOptimizer
from echo_rl.planning.policy import PolicyNetwork

__all__ = ["LatentPlanningOptimizer", "PlanDistribution", "PolicyNetwork", "StateWindow", "TrajectoryEncoder",
           "consecutive_plan_kl", "gaussian_kl"]

"""EchoRL's numeric kernels: a numpy reference for each, a compiled C++ path for the hot ones.

The kernel table (numpy arrays in, numpy arrays or floats out):

=============================  ==============================================================
``EMAPlanTracker``             tau_bar <- d*tau_bar + (1-d)*tau (single and batched updates)
``plan_surprise`` (+batch)     surprise_weight*||tau - tau_bar||^2 + reward_weight*|r|
``prefix_match`` (+batch)      longest common prefix of token-id sequences
``priority_sample``            proportional (p^alpha) or softmax (exp(s/T)) stratified draws
``attention_bandwidth_cost``   b(t) = scale*t(t+1)/2 (+batch)
``effective_bandwidth_cost``   b(t) - b(t') for a reused prefix of length t'
``bandwidth_aware_priorities`` r / (b_eff + q + eps)
``schedule_priorities``        dispatch order by descending priority, FIFO on ties
``bandwidth_efficiency``       eta_bw = E[sum r] / (E[sum b_eff] + E_B[w*|l_PG|])
``temporal_kl`` (+batch)       KL between diagonal Gaussians (mean, log-variance)
``state_hash`` (+batch)        stable 64-bit BLAKE2b hash of a state
``SumTree``                    O(log N) priority tree: batched set, stratified level-synchronous
                               sampling, row gathers (compiled when available)
=============================  ==============================================================

The array (batch) forms of ``EMAPlanTracker``, ``plan_surprise``, ``prefix_match``,
``priority_sample`` and the four bandwidth kernels run compiled when the module is
loaded (``use_native=False`` forces numpy); one-value forms stay in numpy, where a C
call gains nothing (docs/benchmarks.md, "Compiled kernels").
``kernels_available()`` says whether the compiled module is loaded.
"""

from echo_rl.kernels._backend import kernels_available, kernels_status
from echo_rl.kernels.bandwidth import (
    attention_bandwidth_cost,
    attention_bandwidth_cost_batch,
    bandwidth_aware_priorities,
    bandwidth_efficiency,
    effective_bandwidth_cost,
    schedule_priorities,
)
from echo_rl.kernels.planning import (
    EMAPlanTracker,
    plan_surprise,
    plan_surprise_batch,
    temporal_kl,
    temporal_kl_batch,
)
from echo_rl.kernels.sampling import priority_probabilities, priority_sample
from echo_rl.kernels.sequence import prefix_match, prefix_match_batch, state_hash, state_hash_batch

__all__ = [
    "EMAPlanTracker", "attention_bandwidth_cost", "attention_bandwidth_cost_batch",
    "bandwidth_aware_priorities", "bandwidth_efficiency", "effective_bandwidth_cost",
    "kernels_available", "kernels_status", "plan_surprise", "plan_surprise_batch", "prefix_match",
    "prefix_match_batch", "priority_probabilities", "priority_sample", "schedule_priorities",
    "state_hash", "state_hash_batch", "temporal_kl", "temporal_kl_batch",
]

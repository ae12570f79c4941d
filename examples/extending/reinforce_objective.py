"""A new LM objective: one loss function plus one registry entry (docs/architecture.md, "Extending EchoRL").

REINFORCE with the group baseline: -A · log π on the action tokens, token-averaged, plus the ECHO term
λ·env CE (λ is 0 under ``--agent ppo``). The learner computes the log-probs, the group-relative
advantages and the optimiser step for every objective; ``--set lm_config.objective=reinforce`` picks it.
"""

from echo_rl.algorithms.echo_loss import env_ce_loss
from echo_rl.algorithms.lm_objectives import ObjectiveTerms
from echo_rl.algorithms.token_logprobs import ce_mask, response_mask
from echo_rl.lm.objectives import ObjectiveInputs, register_lm_objective


def reinforce_loss(x: ObjectiveInputs) -> ObjectiveTerms:
    acts = x.actions()
    pg_loss = (-x.advantages[:, None] * x.logprobs * acts).sum() / acts.sum().clamp(min=1)
    b = x.batch
    target = ce_mask(b.roles, response_mask(b.prompt_length, b.input_ids.shape[1], b.attention_mask),
                     x.config.ce_target)
    env_ce = env_ce_loss(x.ce_logprobs, target, b.env_output_count, normalization=x.config.ce_normalization)
    return ObjectiveTerms(pg_loss + x.lam * env_ce, {"pg_loss": pg_loss.item(), "env_ce": env_ce.item()})


register_lm_objective("reinforce", reinforce_loss, description="REINFORCE with the group baseline (+ λ·env CE)")

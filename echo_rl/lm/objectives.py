"""The LM objective registry: ``lm_config.objective`` name -> the loss the learner minimises.

An objective is one loss function plus one registry entry: ``loss(x: ObjectiveInputs) -> terms``,
where ``terms`` has ``loss`` (a scalar tensor to minimise), ``metrics`` (a dict of floats, logged as
``lm/<key>``) and ``row_env_ce`` (``[B]`` detached env CE per trajectory, for replay priorities, or
None). The learner does the rest once for every objective: the forward pass (chunked LM head,
micro-batches, the latent plan), the advantages (group-relative, or GAE from the value head when the
entry says ``value_head=True``), the optimiser step and the weight sync to the engine.

An entry may also bring its own advantages: ``advantages(trajectories, batch, config) -> (adv, metrics)``
with ``adv`` ``[B]`` or ``[B, L]`` (per token), computed over the whole groups of a fresh batch in place
of the group-relative ones.

Built in: ``grpo`` (GRPO's clipped ratio on group-relative advantages, plus the ECHO term λ·env CE),
``gigpo`` (the same loss on GiGPO's episode + step-level advantages over anchor states, per action token)
and ``ppo-rlhf`` (a value head, GAE over turns or tokens, clipped policy + value loss, plus λ·env CE).
A user registers another from their own module (``echo-rl --plugin MODULE``)::

    register_lm_objective("reinforce", reinforce_loss)

This module is imported by ``import echo_rl`` (it registers the name check of ``lm_config.objective``),
so it stays torch-free; built-in losses are named ``"module:function"`` and imported when first used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from echo_rl.config import ConfigError
from echo_rl.config.names import register_name_rule
from echo_rl.utils.optional import load_attr

REGISTER_HINT = "register your own with echo_rl.lm.objectives.register_lm_objective(name, loss)"


@dataclass(frozen=True)
class ObjectiveInputs:
    """What an objective's loss sees for one learner batch; token tensors are ``[B, L]``, aligned with
    ``batch.input_ids`` and zero outside the positions a loss reads (action and env-output tokens)."""

    logprobs: Any  # log-probs at the rollout temperature (the policy term), with gradient
    ce_logprobs: Any  # log-probs at temperature 1 (the ECHO env-CE term); the same tensor when T = 1
    batch: Any  # the collated batch (echo_rl.lm.batch): roles, prompt_length, behavior_logprobs,
    #             attention_mask, env_output_count, returns, group_ids, policy_version
    advantages: Any  # [B] per trajectory (group-relative or replayed), or [B, L] per token (value_head: GAE)
    lam: float  # this step's λ of the ECHO term (0: no env CE)
    config: Any  # the run's LMConfig: clip, ce_target, ce_normalization, pg_reduction, vf_coef, gigpo_*...
    ref_logprobs: Any = None  # the frozen reference's log-probs (kl_coef > 0), else None
    weights: Any = None  # [B] importance weights of replayed trajectories, else None
    values: Any = None  # value_head objectives: V per token [B, L] (with gradient)
    returns: Any = None  # value_head objectives: GAE returns [B, L]
    value_mask: Any = None  # value_head objectives: where the value loss applies
    action_mask: Any = None  # the action tokens; :meth:`actions` computes it when not given

    def actions(self) -> Any:
        """The action-token mask ``[B, L]`` (float): the tokens the policy wrote."""
        if self.action_mask is not None:
            return self.action_mask
        from echo_rl.algorithms.token_logprobs import action_mask, response_mask  # torch: loaded on first use

        b = self.batch
        return action_mask(b.roles, response_mask(b.prompt_length, b.input_ids.shape[1], b.attention_mask))


@dataclass(frozen=True)
class LMObjective:
    name: str
    loss: Callable[[ObjectiveInputs], Any] | str  # the loss, or "module:function" imported on first use
    value_head: bool = False  # the learner adds a value head and passes GAE advantages, values and returns
    description: str = ""
    advantages: Callable[..., Any] | str | None = None  # (trajectories, batch, config) -> (adv, metrics); None: GRPO's

    def loss_fn(self) -> Callable[[ObjectiveInputs], Any]:
        return load_attr(self.loss) if isinstance(self.loss, str) else self.loss

    def advantages_fn(self) -> Callable[..., Any] | None:
        if self.advantages is None:
            return None
        return load_attr(self.advantages) if isinstance(self.advantages, str) else self.advantages


def _check_callable(name: str, what: str, fn: Any) -> None:
    if isinstance(fn, str):
        module, sep, attr = fn.partition(":")
        if not (module and sep and attr):
            raise ConfigError(f"{what} of objective {name!r} is invalid: name it as 'module:function'")
    elif not callable(fn):
        raise ConfigError(f"{what} of objective {name!r} is invalid: must be callable, got {type(fn).__name__}")


_OBJECTIVES: dict[str, LMObjective] = {}


def register_lm_objective(name: str, loss: Callable[[ObjectiveInputs], Any] | str, *, value_head: bool = False,
                          description: str = "", advantages: Callable[..., Any] | str | None = None) -> LMObjective:
    """Make ``name`` valid as ``lm_config.objective`` (``--set lm_config.objective=NAME``); registering again
    replaces it. ``loss(x: ObjectiveInputs)`` returns terms with ``loss``, ``metrics`` and ``row_env_ce``;
    ``advantages`` (optional) replaces the group-relative advantages of fresh batches."""
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ConfigError(f"objective name {name!r} is invalid: must be a non-empty string without surrounding "
                          f"spaces")
    _check_callable(name, "loss", loss)
    if advantages is not None:
        if value_head:
            raise ConfigError(f"advantages of objective {name!r} is invalid: a value-head objective's advantages "
                              "are GAE's")
        _check_callable(name, "advantages", advantages)
    spec = LMObjective(name, loss, bool(value_head), description, advantages)
    _OBJECTIVES[name] = spec
    return spec


def objective_names() -> list[str]:
    return list(_OBJECTIVES)


def get_objective(name: str) -> LMObjective:
    if name not in _OBJECTIVES:
        raise ConfigError(f"objective={name!r} is invalid: allowed: {', '.join(_OBJECTIVES)} ({REGISTER_HINT})")
    return _OBJECTIVES[name]


register_lm_objective("grpo", "echo_rl.algorithms.lm_objectives:grpo_echo_loss",
                      description="group-relative advantages, no critic; the ECHO term adds λ·env CE")
register_lm_objective("ppo-rlhf", "echo_rl.algorithms.lm_objectives:ppo_rlhf_echo_loss", value_head=True,
                      description="value head + GAE (InstructGPT style); the ECHO term adds λ·env CE")
register_lm_objective("gigpo", "echo_rl.algorithms.lm_objectives:grpo_echo_loss",
                      advantages="echo_rl.algorithms.lm_objectives:gigpo_step_advantages",
                      description="GiGPO: episode + step-level (anchor-state) advantages per action token, no critic; "
                                  "the ECHO term adds λ·env CE")
register_name_rule("lm_objective", objective_names)  # LMConfig(objective=...) is checked against this registry

"""One optimiser step of a causal LM on token trajectories: ECHO/GRPO, PPO-RLHF (+ ECHO), or SFT.

The loss is the registered objective's (:mod:`echo_rl.lm.objectives`):
``objective="grpo"`` uses group-relative advantages (no critic);
``objective="gigpo"`` brings its own (an ``advantages`` hook: episode + step-level, per token);
``objective="ppo-rlhf"`` (a ``value_head`` objective) adds a
:class:`~echo_rl.algorithms.ppo_rlhf.ValueHead` on the last hidden state and
GAE over turns or action tokens, with the KL to the reference folded into the
rewards (InstructGPT style). Either way the ECHO term λ·CE on env-output
tokens comes from the same forward pass.

The learner reads the run's :class:`~echo_rl.config.LMConfig` as it is (``clip`` both sides of the
ratio, the policy term at the rollout ``temperature``, ``learner_token_budget`` / ``learner_chunk_tokens``,
the objective's settings) and the latent planner's own
:class:`~echo_rl.config.PlanningConfig` (``kl_weight``, ``learning_rate``, ``max_grad_norm``); only λ, which
the agent derives from ``--agent`` and ``echo_config``, comes as an argument.

Weights move here and reach the engine through ``engine.update_weights``
(which bumps the policy version, so no stale KV is reused); trajectories
sampled by a version more than ``max_staleness`` behind are refused rather
than silently trained on.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from echo_rl.algorithms.echo_loss import LambdaSchedule, env_ce_loss
from echo_rl.algorithms.grpo import group_advantages
from echo_rl.algorithms.ppo_rlhf import ValueHead, rewards_at_turn_ends, rlhf_advantages
from echo_rl.algorithms.token_logprobs import (action_mask, ce_mask, hidden_logprobs, needed_positions,
                                               reduce_tokens, response_mask, sequence_logprobs)
from echo_rl.config import ConfigError, LMConfig
from echo_rl.lm.batch import collate
from echo_rl.lm.lora import is_lora, merged_state_dict, plain_copy
from echo_rl.lm.objectives import ObjectiveInputs, get_objective
from echo_rl.lm.plan import LMPlanner, plan_distributions, plan_kl, planned_forward
from echo_rl.types import TokenTrajectory



def chunked_head(model: Any) -> bool:
    """Are the model's logits a plain linear head over its base model's last hidden state (Llama, Qwen,
    Mistral, GPT-2...)? Then the learner applies that head only where a loss needs it."""
    cfg = getattr(model, "config", None)
    return (isinstance(model.get_output_embeddings(), torch.nn.Linear) and hasattr(model, model.base_model_prefix)
            and getattr(cfg, "final_logit_softcapping", None) is None and not getattr(cfg, "logit_scale", None))


COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _row_env_ce(terms: Any, rows: int) -> np.ndarray:
    """Each trajectory's env CE from an objective's terms (zeros when the objective gives none)."""
    row = getattr(terms, "row_env_ce", None)
    return np.zeros(rows, np.float32) if row is None else row.cpu().numpy()


def _row_advantages(adv: torch.Tensor, batch: Any) -> tuple[np.ndarray, np.ndarray, float]:
    """(advantage, |advantage| per trajectory, mean |advantage|): per-token advantages ``[B, L]`` are averaged
    over each row's action tokens."""
    if adv.dim() == 1:
        return adv.cpu().numpy(), adv.abs().cpu().numpy(), float(adv.abs().mean())
    acts = action_mask(batch.roles, response_mask(batch.prompt_length, batch.input_ids.shape[1],
                                                  batch.attention_mask))
    n = acts.sum(1).clamp(min=1)
    return (((adv * acts).sum(1) / n).cpu().numpy(), ((adv.abs() * acts).sum(1) / n).cpu().numpy(),
            float((adv.abs() * acts).sum() / acts.sum().clamp(min=1)))


class LMLearner:
    """Owns the trainable model (and the latent planner, if any), its optimiser and the policy version.

    With a ``planner`` every action is scored with its plan's soft prefix before it, exactly as the engine
    sampled it (:func:`~echo_rl.lm.plan.planned_forward`); the trajectories carry the actor's
    ε in ``info["plan_eps"]`` (expert demonstrations use the plan mean, ε = 0).
    """

    def __init__(self, model: Any, pad_id: int, config: LMConfig, *, lam: float | LambdaSchedule = 0.0,
                 ref_model: Any | None = None, planner: LMPlanner | None = None) -> None:
        """``lam``: λ of the ECHO env-CE term at step 0 (0: none), scheduled by ``env_loss_schedule``; or a
        ready :class:`LambdaSchedule`."""
        self.model, self.pad_id = model, int(pad_id)
        if config.learning_rate is None:
            raise ConfigError("lm_config.learning_rate=None is invalid for the learner: set it, or resolve the "
                              "backbone's default first (echo_rl.lm.policy.resolve_lm_defaults)")
        self.config = config
        if not isinstance(lam, LambdaSchedule):
            lam = LambdaSchedule(float(lam), config.env_loss_schedule, config.env_loss_steps, config.env_loss_end,
                                 config.env_loss_factor) if lam else LambdaSchedule(0.0)
        self.lam = lam
        self.ref_model = ref_model
        self.planner = planner
        if self.config.kl_coef and ref_model is None:
            raise ValueError("kl_coef > 0 needs ref_model (a frozen copy of the initial policy)")
        self.value_head = None
        self.objective = get_objective(self.config.objective)
        if self.objective.value_head:
            if planner is not None:  # the one place an objective's needs are checked against the run
                raise ConfigError(f"lm_config.objective={self.config.objective!r} is invalid with the latent plan "
                                  "(the value head needs the plain forward's hidden states): add --no-plan or use "
                                  "--agent ppo")
            self.value_head = ValueHead(model.config.hidden_size).to(next(model.parameters()).device)
        self.last_rows: dict[str, np.ndarray] = {}  # per-trajectory |advantage| and env CE of the last update
        self.optimizer = self.make_optimizer(self.config.learning_rate)
        self.version = 0
        self.steps = 0
        self._deferred: tuple | None = None  # micro-batches whose backward waits for the loss's gradient

    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        # frozen weights (the base model under LoRA) get no optimiser state
        groups = [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": lr}]
        if self.planner is not None:
            groups.append({"params": list(self.planner.parameters()), "lr": self.planner.config.learning_rate})
        if self.value_head is not None:
            groups.append({"params": list(self.value_head.parameters()), "lr": lr})
        return torch.optim.AdamW(groups)

    def _plan_eps(self, trajectories: Sequence[TokenTrajectory]) -> list:
        out = []
        for t in trajectories:
            eps = t.info.get("plan_eps")
            if eps is None:
                if t.info.get("source") != "expert":
                    raise ValueError(f"trajectory {t.episode_id} has no info['plan_eps']: it was not sampled with "
                                     "a latent plan, but this learner has a planner")
                eps = np.zeros((t.num_turns, self.planner.latent_dim), np.float32)
            out.append(eps)
        return out

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _groups(self, trajectories: Sequence[TokenTrajectory]) -> list[list[int]]:
        """Row indices per micro-batch: by length, as many rows as fit ``token_budget`` padded tokens."""
        order = sorted(range(len(trajectories)), key=lambda i: len(trajectories[i]))
        groups: list[list[int]] = []
        cur: list[int] = []
        for i in order:
            if cur and len(trajectories[i]) * (len(cur) + 1) > self.config.learner_token_budget:
                groups.append(cur)
                cur = []
            cur.append(i)
        return groups + [cur]

    def _budgeted_logprobs(self, model: Any, trajectories: Sequence[TokenTrajectory], batch: Any,
                           needed: torch.Tensor, temperatures: tuple[float, ...] = (1.0,),
                           planned: bool = False) -> tuple[list, list]:
        """:meth:`_logprobs` in micro-batches of at most ``token_budget`` tokens, with the same gradient.

        A batch that fits is one pass. A larger one: log-probs of every micro-batch without a graph, returned
        as leaf tensors; the loss is built on them as usual, and :meth:`_step`, after ``loss.backward()`` has
        put dloss/dlog-prob on the leaves, replays each micro-batch with a graph and back-propagates
        ``Σ log-prob · dloss/dlog-prob``: exactly the full-batch gradient (every loss here is a function of the
        per-token log-probs), for one extra forward pass, with one micro-batch's activations alive at a time.
        """
        if torch.is_grad_enabled():
            self._deferred = None  # a failed earlier update must not leave its micro-batches behind
        groups = self._groups(trajectories)
        if len(groups) == 1:
            return self._logprobs(model, trajectories, batch, needed, temperatures, planned)
        outs = [torch.zeros(batch.input_ids.shape, device=batch.input_ids.device) for _ in temperatures]
        with torch.no_grad():
            for g, sub, sb in self._micro(trajectories, groups):
                lps, _ = self._logprobs(model, sub, sb, needed[g, :sb.input_ids.shape[1]], temperatures, planned)
                for o, lp in zip(outs, lps):
                    o[g, :lp.shape[1]] = lp
        dists = plan_distributions(model, self.planner, trajectories, self._plan_eps(trajectories)) \
            if planned else []
        if not torch.is_grad_enabled():
            return outs, dists
        leaves = [o.requires_grad_() for o in outs]
        self._deferred = (model, trajectories, groups, needed, temperatures, planned, leaves)
        return leaves, dists

    def _micro(self, trajectories: Sequence[TokenTrajectory], groups: list[list[int]]):
        for g in groups:
            sub = [trajectories[i] for i in g]
            yield torch.tensor(g, device=self._device()), sub, collate(sub, self.pad_id).to(self._device())

    def _backward_deferred(self) -> None:
        model, trajectories, groups, needed, temperatures, planned, leaves = self._deferred
        self._deferred = None
        grads = [leaf.grad for leaf in leaves]
        for g, sub, sb in self._micro(trajectories, groups):
            width = sb.input_ids.shape[1]
            lps, _ = self._logprobs(model, sub, sb, needed[g, :width], temperatures, planned)
            terms = [(lp * gr[g, :width]).sum() for lp, gr in zip(lps, grads) if gr is not None]
            if terms:
                torch.stack(terms).sum().backward()

    def _logprobs(self, model: Any, trajectories: Sequence[TokenTrajectory], batch: Any, needed: torch.Tensor,
                  temperatures: tuple[float, ...] = (1.0,), planned: bool = False) -> tuple[list, list]:
        """Per-token log-probs ``[B, L]`` at each temperature where ``needed`` (0 elsewhere), and the plan
        distributions (``planned``: every action with its latent plan before it, as the engine sampled it).

        The LM head runs only on the needed positions, in chunks (:func:`hidden_logprobs`); a model whose
        logits are not a plain linear head over the last hidden state takes the full-logits path."""
        eps = self._plan_eps(trajectories) if planned else None
        if chunked_head(model):
            with self._autocast(batch.input_ids.device):
                if planned:
                    hidden, dists = planned_forward(model, self.planner, trajectories, eps, batch.input_ids.shape[1],
                                                    return_hidden=True)
                else:
                    base = getattr(model, model.base_model_prefix)
                    hidden, dists = base(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                          use_cache=False).last_hidden_state, []
            return hidden_logprobs(hidden.float(), model.get_output_embeddings(), batch.input_ids, needed,
                                   temperatures, self.config.learner_chunk_tokens), dists
        with self._autocast(batch.input_ids.device):
            if planned:
                logits, dists = planned_forward(model, self.planner, trajectories, eps, batch.input_ids.shape[1])
            else:
                logits, dists = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, []
        return [sequence_logprobs(logits.float(), batch.input_ids, T) * needed for T in temperatures], dists

    def _autocast(self, device: torch.device) -> Any:
        """bf16 autocast of the forward (fp32 weights and grads stay), or a no-op at float32."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.config.compute_dtype == "bfloat16")

    def update(self, trajectories: Sequence[TokenTrajectory], *, advantages: Sequence[float] | None = None,
               weights: Sequence[float] | None = None) -> dict[str, float]:
        """One ECHO step (GRPO when λ = 0; PPO-RLHF + λ·CE with ``objective="ppo-rlhf"``).

        Without ``advantages`` the batch must hold complete groups (they are
        normalised here, or by the objective's ``advantages`` hook); replayed trajectories bring the advantages stored
        when their group was added, and their importance ``weights``.
        PPO-RLHF computes its advantages by GAE from the value head and ignores
        ``advantages``.
        """
        cfg = self.config
        stale = [t.policy_version for t in trajectories if self.version - t.policy_version > cfg.max_staleness]
        if stale:
            raise ValueError(f"{len(stale)} trajectories are from policy version {min(stale)}, more than "
                             f"max_staleness={cfg.max_staleness} behind the learner's {self.version}")
        batch = collate(trajectories, self.pad_id).to(self._device())
        if self.value_head is not None:
            return self._value_head_update(trajectories, batch, weights)
        adv_metrics: dict[str, float] = {}
        hook = self.objective.advantages_fn()
        if advantages is not None:
            adv = torch.as_tensor(np.asarray(advantages, np.float32), device=batch.returns.device)
        elif hook is not None:  # the objective's own advantages ([B] or per token [B, L]), over whole groups
            adv, adv_metrics = hook(trajectories, batch, cfg)
        else:
            adv = group_advantages(batch.returns, batch.group_ids, scale=cfg.advantage_scale)
        w = None if weights is None else torch.as_tensor(np.asarray(weights, np.float32), device=adv.device)
        self.model.train()
        T = cfg.temperature or 1.0
        needed = self._needed(batch)
        planned = self.planner is not None
        lps, dists = self._budgeted_logprobs(self.model, trajectories, batch, needed,
                                             (T, 1.0) if T != 1.0 else (1.0,), planned)
        ref = None
        if self.ref_model is not None and cfg.kl_coef:
            with torch.no_grad():  # with a planner the reference sees the same plans (its drift, not the plan's)
                ref = self._budgeted_logprobs(self.ref_model, trajectories, batch, needed, (T,), planned)[0][0]
        lam = self.lam(self.steps)
        terms = self.objective.loss_fn()(ObjectiveInputs(lps[0], lps[-1], batch, adv, lam, cfg, ref_logprobs=ref,
                                                         weights=w))
        loss, kl_metrics = self._with_plan_kl(terms.loss, dists)
        staleness = float(self.version - batch.policy_version.min())
        row_adv, row_abs, adv_abs_mean = _row_advantages(adv.detach(), batch)
        self.last_rows = {"advantage": row_adv, "advantage_abs": row_abs,
                          "env_ce": _row_env_ce(terms, len(trajectories))}
        metrics = self._step(loss)
        metrics.update(terms.metrics)
        metrics.update(kl_metrics)
        metrics.update(adv_metrics)
        metrics.update({"return_mean": float(batch.returns.mean()), "advantage_abs_mean": adv_abs_mean,
                        "staleness_max": staleness})
        return metrics

    def _needed(self, batch: Any) -> torch.Tensor:
        resp = response_mask(batch.prompt_length, batch.input_ids.shape[1], batch.attention_mask)
        return needed_positions(batch.roles, resp)

    def forward_with_values(self, batch: Any, temperatures: tuple[float, ...] = (1.0,)
                            ) -> tuple[list, torch.Tensor, torch.Tensor]:
        """(log-probs ``[B, L]`` per temperature at the needed positions, values ``[B, L]`` aligned like them,
        V of each row's final context ``[B]``)."""
        with self._autocast(batch.input_ids.device):
            out = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                             output_hidden_states=True, logits_to_keep=1) if chunked_head(self.model) else \
                self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
        hidden = out.hidden_states[-1].float()
        values = self.value_head(hidden)
        last = batch.attention_mask.sum(1) - 1
        final = self.value_head.proj(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
        needed = self._needed(batch)
        if chunked_head(self.model):
            lps = hidden_logprobs(hidden, self.model.get_output_embeddings(), batch.input_ids, needed, temperatures,
                                  self.config.learner_chunk_tokens)
        else:
            lps = [sequence_logprobs(out.logits.float(), batch.input_ids, T) * needed for T in temperatures]
        return lps, values, final.squeeze(-1)

    def _value_head_update(self, trajectories: Sequence[TokenTrajectory], batch: Any,
                           weights: Sequence[float] | None) -> dict[str, float]:
        """A value-head objective's step (PPO-RLHF): turn rewards on each turn's last action token, GAE from
        the value head (bootstrapped from V(final context) when the episode was cut by a time limit), then the
        objective's loss (PPO-RLHF: clipped policy + value loss, plus λ·env CE). One epoch per batch, so the
        old values are this forward's (detached)."""
        cfg = self.config
        w = None if weights is None else torch.as_tensor(np.asarray(weights, np.float32), device=batch.returns.device)
        self.model.train()
        T = cfg.temperature or 1.0
        lps, values, final = self.forward_with_values(batch, (T, 1.0) if T != 1.0 else (1.0,))
        lp = lps[0]
        resp = response_mask(batch.prompt_length, batch.input_ids.shape[1], batch.attention_mask)
        acts = action_mask(batch.roles, resp)
        token_rewards = rewards_at_turn_ends(acts, [t.rewards for t in trajectories])
        ref = None
        if self.ref_model is not None and cfg.kl_coef:
            with torch.no_grad():
                ref = self._logprobs(self.ref_model, trajectories, batch, self._needed(batch), (T,))[0][0]
        truncated = torch.tensor([float(bool(t.info.get("truncated"))) for t in trajectories], device=final.device)
        adv, ret, vmask = rlhf_advantages(token_rewards, values.detach(), acts, gamma=cfg.gamma, lam=cfg.gae_lambda,
                                          level=cfg.gae_level, logprobs=batch.behavior_logprobs, ref_logprobs=ref,
                                          kl_coef=cfg.kl_coef, last_values=final.detach() * truncated)
        terms = self.objective.loss_fn()(ObjectiveInputs(lp, lps[-1], batch, adv, self.lam(self.steps), cfg,
                                                         ref_logprobs=ref, weights=w, values=values, returns=ret,
                                                         value_mask=vmask, action_mask=acts))
        with torch.no_grad():
            n_act = acts.sum(1).clamp(min=1)
            self.last_rows = {"advantage": ((adv * acts).sum(1) / n_act).cpu().numpy(),
                              "advantage_abs": ((adv.abs() * acts).sum(1) / n_act).cpu().numpy(),
                              "env_ce": _row_env_ce(terms, len(trajectories))}
            n = acts.sum().clamp(min=1)
            metrics = {**terms.metrics, "advantage_abs_mean": float((adv.abs() * acts).sum() / n),
                       "return_mean": float(batch.returns.mean()),
                       "staleness_max": float(self.version - batch.policy_version.min())}
        metrics.update(self._step(terms.loss))
        return metrics

    def sft_update(self, trajectories: Sequence[TokenTrajectory], env_lambda: float = 0.0) -> dict[str, float]:
        """Behaviour cloning: CE on action tokens (+ ``env_lambda`` · env CE), e.g. on expert episodes."""
        batch = collate(trajectories, self.pad_id).to(self._device())
        self.model.train()
        (lp,), dists = self._budgeted_logprobs(self.model, trajectories, batch, self._needed(batch),
                                               planned=self.planner is not None)
        resp = response_mask(batch.prompt_length, batch.input_ids.shape[1], batch.attention_mask)
        act = action_mask(batch.roles, resp)
        action_ce = reduce_tokens(-lp, act, "token_mean")
        env_ce = env_ce_loss(lp, ce_mask(batch.roles, resp, self.config.ce_target), batch.env_output_count)
        loss = action_ce + env_lambda * env_ce if env_lambda else action_ce
        loss, kl_metrics = self._with_plan_kl(loss, dists)
        metrics = self._step(loss)
        metrics.update(kl_metrics)
        metrics.update({"sft_action_ce": float(action_ce.detach()), "env_ce": float(env_ce.detach())})
        return metrics

    def _with_plan_kl(self, loss: torch.Tensor, dists: list) -> tuple[torch.Tensor, dict[str, float]]:
        if self.planner is None:
            return loss, {}
        kl = plan_kl(dists)
        std = torch.cat([d.std for d in dists]).mean()
        metrics = {"plan_kl": float(kl.detach()), "plan_std": float(std.detach())}
        return loss + self.planner.config.kl_weight * kl, metrics

    def _step(self, loss: torch.Tensor) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        try:
            loss.backward()
            if self._deferred is not None:
                self._backward_deferred()
        finally:
            self._deferred = None
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        if self.value_head is not None:
            torch.nn.utils.clip_grad_norm_(self.value_head.parameters(), self.config.max_grad_norm)
        if self.planner is not None:
            torch.nn.utils.clip_grad_norm_(self.planner.parameters(), self.planner.config.max_grad_norm)
        self.optimizer.step()
        self.steps += 1
        self.version += 1
        self.model.eval()
        return {"loss": float(loss.detach()), "grad_norm": float(norm), "learner_step": float(self.steps),
                "policy_version": float(self.version)}

    @torch.no_grad()
    def held_out_env_ce(self, trajectories: Sequence[TokenTrajectory]) -> float:
        """Token-mean env-output CE on a fixed trajectory pool (the paper's world-model metric)."""
        batch = collate(trajectories, self.pad_id).to(self._device())
        was = self.model.training
        self.model.eval()
        resp = response_mask(batch.prompt_length, batch.input_ids.shape[1], batch.attention_mask)
        m = ce_mask(batch.roles, resp, "env_only")
        lp = self._budgeted_logprobs(self.model, trajectories, batch, m > 0)[0][0]
        self.model.train(was)
        return float((-lp * m).sum() / m.sum().clamp(min=1))

    def state_dict_for_engine(self) -> dict[str, torch.Tensor]:
        """The weights the engine's plain copy loads: under LoRA, each adapted weight merged (W + scale·B·A)."""
        if is_lora(self.model):
            return merged_state_dict(self.model)
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def engine_copy(self) -> Any:
        """A copy of the policy for the engine: the same model, or under LoRA a plain one with merged weights."""
        import copy

        engine_model = plain_copy(self.model) if is_lora(self.model) else copy.deepcopy(self.model)
        return engine_model.to(self.engine_dtype)

    @property
    def engine_dtype(self) -> torch.dtype:
        """The dtype of the engine's weights (and its planner's): the compute dtype."""
        return COMPUTE_DTYPES[self.config.compute_dtype]

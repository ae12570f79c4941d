"""Component configs: the knobs of each part of a run (PPO, planning, replay, bandwidth, engine, LM agents).

Each is owned by its module (named in the docstring); they live on the config
floor so one place documents every knob a run can turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from echo_rl.config.base import ConfigBase, spec


@dataclass
class PPOConfig(ConfigBase):
    """PPO hyper-parameters (``echo_rl.algorithms.ppo``); CleanRL names and semantics."""

    learning_rate: float = spec(3e-4, help="Adam learning rate", gt=0)
    clip_epsilon: float = spec(0.2, help="policy ratio clip range", gt=0)
    value_loss_coef: float = spec(0.5, help="weight of the value loss", min=0)
    entropy_coef: float = spec(0.01, help="weight of the entropy bonus", min=0)
    kl_coef: float = spec(0.1, help="weight of a KL(old||new) penalty in the loss (0 disables it)", min=0)
    max_grad_norm: float = spec(0.5, help="global gradient-norm clip", gt=0)
    gae_lambda: float = spec(0.95, help="GAE lambda", min=0, max=1)
    gamma: float = spec(0.99, help="discount factor", min=0, max=1)
    num_epochs: int = spec(4, help="optimisation epochs per rollout batch", min=1)
    batch_size: int = spec(256, help="minibatch size of each gradient step", min=1)
    target_kl: float | None = spec(None, help="stop the epoch loop once approx KL exceeds this (None: never)")
    value_clip: float | None = spec(0.2, help="clip value updates to +-value_clip around the old value (None: off)")
    normalize_advantages: bool = spec(True, help="normalise advantages per minibatch")
    scale_rewards: bool = spec(False, help="divide the learner's rewards by the running std of the discounted "
                                            "return, clipped to +-10 (PPO; continuous control: Pendulum)")
    anneal_lr: bool = spec(True, help="anneal the learning rate linearly to 0 over total_timesteps (a resume with "
                                      "a larger --timesteps stretches the schedule: the LR rises to the new "
                                      "schedule's value there, as SB3's reset_num_timesteps=False does)")

    def validate(self) -> None:
        if self.target_kl is not None and self.target_kl <= 0:
            self._fail("target_kl", self.target_kl, "must be > 0 or None")
        if self.value_clip is not None and self.value_clip <= 0:
            self._fail("value_clip", self.value_clip, "must be > 0 or None")


@dataclass
class PlanningConfig(ConfigBase):
    """Latent planning (``echo_rl.core.latent_planning``).

    No ``noise_std``: the plan is a reparameterised sample of the encoder's own
    learned Gaussian, so a fixed extra noise had nothing left to do.
    """

    embedding_dim: int = spec(512, help="dimension of the latent plan tau", min=1)
    state_window_size: int = spec(8, help="k: number of past states the plan encoder reads", min=1)
    kl_weight: float = spec(0.1, help="weight of KL[p(tau_t)||p(tau_t-1)] in the loss (0: no KL term)", min=0)
    ema_decay: float = spec(0.99, help="decay of the EMA plan tau_bar that plan surprise is measured against",
                            min=0, max=1)
    soft_prefix_alpha: float = spec(0.5, help="scale of the plan's FiLM/soft-prefix conditioning (0: plan unused)",
                                    min=0)
    learning_rate: float = spec(3e-4, help="Adam learning rate of the plan encoder's parameter group", gt=0)
    max_grad_norm: float = spec(1.0, help="gradient-norm clip applied to the plan encoder's parameters", gt=0)


@dataclass
class ReplayConfig(ConfigBase):
    """Hot/cold prioritized replay (``echo_rl.core.prioritized_replay``)."""

    hot_buffer_size: int = spec(1_000_000, help="capacity of the hot (recent) buffer", min=1)
    cold_buffer_size: int = spec(10_000_000, help="capacity of the cold (older) buffer", min=0)
    age_threshold: int = spec(1000, help="age (samples added since) at which a sample migrates hot -> cold",
                              min=1)
    max_replay_age: int = spec(100_000, help="samples this old (samples added since) are evicted, never sampled",
                               min=1)
    sampling_mode: str = spec("softmax", help="softmax: P ~ exp(score/T); proportional: P ~ (p+eps)^alpha",
                              choices=("softmax", "proportional"))
    temperature: float = spec(1.0, help="softmax temperature over plan-surprise scores", gt=0)
    surprise_weight: float = spec(1.0, help="weight of ||tau - tau_ema||^2 in the score", min=0)
    reward_weight: float = spec(1.0, help="weight of |r| in the score", min=0)
    ema_decay: float = spec(0.99, help="decay of the EMA plan tau_bar", min=0, max=1)
    min_experiences: int = spec(1000, help="sampling raises ReplayNotReadyError until this many are stored",
                                min=1)
    priority_alpha: float = spec(0.6, help="PER exponent alpha (proportional mode)", min=0)
    priority_epsilon: float = spec(1e-6, help="added to priorities before ^alpha (proportional mode)", min=0)
    importance_sampling_beta: float = spec(0.4, help="importance-weight exponent beta", min=0, max=1)
    hot_sample_ratio: float = spec(0.7, help="share of each batch drawn from the hot buffer", min=0, max=1)
    sampler: str = spec("prioritized", help="which stored samples a draw returns (the dqn agent's replay service): "
                                            "prioritized (PER), uniform or fifo",
                        choices=("prioritized", "uniform", "fifo"))
    samples_per_insert: float | None = spec(None, help="rate limiter of the dqn agent's replay service: sampled items "
                                                       "per inserted one, kept within rate_error_buffer (None: no "
                                                       "limiter; the learner follows train_frequency)", gt=0)
    rate_error_buffer: float = spec(1024.0, help="half-width of the samples-per-insert band (Reverb's error_buffer)",
                                    gt=0)


@dataclass
class DQNConfig(ConfigBase):
    """The dqn agent's learner (``echo_rl.vector.dqn_agent``), CleanRL's dqn.py knobs.

    ``TrainingConfig.learning_starts`` and the replay's ``min_experiences`` gate the first update;
    ``TrainingConfig.train_frequency`` / ``batch_size`` only set how many env steps one trainer iteration
    (one metrics row) spans.
    """

    learning_rate: float = spec(1e-3, help="Adam learning rate", gt=0)
    gamma: float = spec(0.9, help="discount (0.9: on MiniGrid the gap a self-loop action leaves, (1 - gamma) V, must "
                                      "exceed the Q error or the greedy policy loops; CartPole: 0.99)", min=0, max=1)
    minibatch_size: int = spec(64, help="transitions per gradient step (CleanRL's batch_size)", min=1)
    train_frequency: int = spec(4, help="env steps (summed over actors) per gradient step", min=1)
    target_network_frequency: int = spec(50, help="gradient steps between target-network updates (CleanRL: 500 env steps "
                                                  "at train_frequency 10)", min=1)
    tau: float = spec(1.0, help="target update rate: 1 copies the online network, < 1 is Polyak averaging",
                      gt=0, max=1)
    start_e: float = spec(1.0, help="epsilon of the epsilon-greedy actors at step 0", min=0, max=1)
    end_e: float = spec(0.05, help="epsilon after the exploration phase", min=0, max=1)
    exploration_fraction: float = spec(0.3, help="share of total_timesteps over which epsilon decays linearly",
                                       gt=0, max=1)
    loss: str = spec("huber", help="TD loss: huber (smooth L1) or mse", choices=("huber", "mse"))
    double_q: bool = spec(True, help="Double DQN target: the online network picks the next action, the target "
                                     "network values it")
    max_grad_norm: float = spec(10.0, help="global gradient-norm clip", gt=0)
    hidden_dim: int = spec(128, help="width of the Q head's two hidden layers", min=1)
    eval_epsilon: float = spec(0.05, help="epsilon of the evaluation episodes (CleanRL evaluates at 0.05: a greedy "
                                          "policy can bump into a wall forever where two Q values nearly tie)",
                                min=0, max=1)


@dataclass
class BandwidthConfig(ConfigBase):
    """Bandwidth accounting and scheduling (``echo_rl.core.bandwidth``)."""

    scale: float = spec(1.0, help="cost scale in b(s_1:t) = scale * t(t+1)/2", gt=0)
    epsilon: float = spec(1e-6, help="epsilon in priority = r / (w*b_eff + q + eps)", gt=0)
    bandwidth_weight: float = spec(1.0, help="w: weight of b_eff in the scheduler's priority denominator "
                                             "(0: rank by reward per queueing cost alone)", min=0)
    pg_loss_weight: float = spec(1.0, help="w in eta_bw's denominator term w*|l_PG|", min=0)


#: Whether the EchoRL agent conditions its policy on the latent plan unless a config says otherwise
#: (``--plan`` / ``--no-plan``); off, because the plan did not earn its cost. The sample-efficiency study
#: (docs/results.md, "The EchoRL vector agent: sample efficiency on MiniGrid") found it changes nothing
#: measurable (13 of 15 cells reached 0.9 with it and without it) at about half the agent's time
#: (docs/benchmarks.md), and the time-to-solve benchmark measures the agent without it against PPO
#: (docs/results.md, "time to solve"). On SmolLM2, ECHO + plan was the weakest LM arm. Saved runs, exported
#: policies and the shipped configs name the field (:data:`SAVED_DEFAULTS` fills it where a saved config
#: does not), so they keep the agent they were made with.
LATENT_PLAN_DEFAULT = False

#: Fields whose default may change, with the value every config saved so far was written under: a saved
#: config (a run directory's config.yaml, an exported policy's metadata) that lacks one gets this value,
#: not whatever the default has since become.
SAVED_DEFAULTS = {"echo_config.latent_plan": True}


def with_saved_defaults(data):
    """``data`` (a saved config's mapping) with each :data:`SAVED_DEFAULTS` field it lacks filled in; anything
    that is not a mapping where one is expected is left for ``from_dict`` to refuse."""
    if not isinstance(data, Mapping):
        return data
    out = dict(data)
    for key, value in SAVED_DEFAULTS.items():
        node, parts = out, key.split(".")
        for part in parts[:-1]:
            child = node.get(part, {})
            if not isinstance(child, Mapping):
                break
            node[part] = child = dict(child)
            node = child
        else:
            node.setdefault(parts[-1], value)
    return out


@dataclass
class EchoAgentConfig(ConfigBase):
    """The EchoRL vector agent's parts (``echo_rl.vector.echo``); each one can be switched off.

    The V-trace clip thresholds are also what the IMPALA baseline uses.
    """

    latent_plan: bool = spec(LATENT_PLAN_DEFAULT, help="condition the policy on the latent plan (--plan / --no-plan; "
                             "False: no plan encoder, no KL). The study found it changes nothing measurable at "
                             "about half the vector agent's time: docs/results.md, the EchoRL vector agent")
    world_model_coef: float = spec(0.5, help="weight of the next-observation prediction loss (0: no world model)",
                                   min=0)
    replay_updates: int = spec(2, help="V-trace minibatch updates on replayed sequences per iteration (0: no replay)",
                               min=0)
    replay_batch_sequences: int = spec(16, help="sequences per replay minibatch", min=1)
    self_imitation_updates: int = spec(16, help="self-imitation minibatches (ppo_config.batch_size steps of "
                                       "terminated episodes, loss weighted by (R - V)+) per iteration (0: off)", min=0)
    self_imitation_value_coef: float = spec(0.01, help="weight of the self-imitation value loss 1/2((R - V)+)^2",
                                            min=0)
    self_imitation_capacity: int = spec(16384, help="steps of terminated episodes the self-imitation store keeps",
                                        min=1)
    sequence_length: int = spec(32, help="steps per replayed sequence (must divide the rollout length)", min=1)
    vtrace_rho_bar: float = spec(1.0, help="V-trace clip of the importance ratio in the value target", gt=0)
    vtrace_c_bar: float = spec(1.0, help="V-trace clip of the trace-cutting ratio c", gt=0)
    hidden_dim: int = spec(128, help="width of the policy trunk", min=1)
    plan_pass: str = spec("minibatch", help="where the plan encoder and world model learn: minibatch (in every "
                          "PPO minibatch; the policy reads the current encoder's plan) or rollout (one pass per "
                          "rollout over whole-env chunks, each state embedded once; the policy reads the plans it "
                          "acted with: 1.7x faster, learning not shown to hold, docs/benchmarks.md)",
                          choices=("minibatch", "rollout"))
    plan_refresh: str = spec("acting", help="with plan_pass=rollout, the plans PPO's policy reads: acting (the "
                             "ones the actors acted with) or epoch (recomputed from the current encoder once per "
                             "PPO epoch, without gradient; its learning is not measured)",
                             choices=("acting", "epoch"))

    def validate(self) -> None:
        if self.plan_refresh != "acting" and self.plan_pass != "rollout":
            self._fail("plan_refresh", self.plan_refresh, "needs plan_pass=rollout (with minibatch the policy "
                                                          "reads the current encoder's plans in every minibatch)")


@dataclass
class ExecutionConfig(ConfigBase):
    """Asynchronous execution engine (``echo_rl.core.async_execution``; guide: docs/engine.md)."""

    max_concurrent_rollouts: int = spec(128, help="sequences in flight (decoded together) at most", min=1)
    max_cache_size: int = spec(1_000_000, help="tokens the radix KV cache may hold (0 disables reuse)", min=0)
    timeout: float = spec(30.0, help="seconds a request may wait for admission before it fails", gt=0)
    schedule_epsilon: float = spec(1e-6, help="epsilon of the priority r / (b_eff + q + eps)", gt=0)
    bandwidth_scale: float = spec(1.0, help="scale of the bandwidth cost b(t) = scale*t(t+1)/2", gt=0)
    enable_bandwidth_scheduling: bool = spec(True, help="admit by bandwidth-aware priority (else FIFO)")
    bandwidth_weight: float = spec(1.0, help="weight of b_eff in the priority denominator", min=0)
    queue_weight: float = spec(1.0, help="weight of the queueing cost q (b_eff waiting ahead) in the "
                                         "priority denominator", min=0)
    kv_memory_budget_mb: float = spec(1024.0, help="KV memory the local engine may hold, MiB: radix cache "
                                                   "+ working KV of running requests", gt=0)
    max_batch_tokens: int = spec(1024, help="token rows per engine step (decode tokens + prefill chunks)", min=1)
    max_context_length: int | None = spec(None, help="longest prompt+output a request may need "
                                                     "(None: the model's max_position_embeddings)")

    def validate(self) -> None:
        if self.max_context_length is not None and self.max_context_length < 2:
            self._fail("max_context_length", self.max_context_length, "must be >= 2 or None")


@dataclass
class LMConfig(ConfigBase):
    """Language-model agents on text tasks (``echo_rl.lm``; guide: docs/lm_training.md).

    On a text task ``--agent ppo`` trains GRPO (PPO's clipped ratio with group-relative
    advantages, no critic) and ``--agent echo-rl`` adds the ECHO env-output CE
    (``env_loss_coef``; ``--no-world-model`` switches it off) and, with ``--plan``, the latent plan as
    soft-prefix embeddings (``--no-kl`` drops its KL).
    """

    env_loss_coef: float = spec(0.05, help="lambda: weight of the ECHO env-output CE for --agent echo-rl", min=0)
    env_loss_schedule: str = spec("constant", help="lambda over learner steps: constant, linear_decay (to "
                                                   "env_loss_end over env_loss_steps) or step_decay (times "
                                                   "env_loss_factor every env_loss_steps)",
                                  choices=("constant", "linear_decay", "step_decay"))
    env_loss_steps: int = spec(1000, help="learner steps of one env_loss_schedule period", min=1)
    env_loss_end: float = spec(0.0, help="linear_decay: lambda after env_loss_steps", min=0)
    env_loss_factor: float = spec(0.5, help="step_decay: lambda's factor every env_loss_steps", gt=0, max=1)
    learning_rate: float | None = spec(None, help="AdamW learning rate of the language model during RL (None: 1e-4 "
                                                  "for a tiny random backbone, 1e-5 for a pretrained one)", gt=0)
    group_size: int = spec(4, help="episodes per task seed (one GRPO group); num_actors must be a multiple", min=1)
    action_mode: str = spec("generate", help="generate: free text, parsed by the task's reply format; choose: "
                                             "pick among the admissible actions by likelihood",
                            choices=("generate", "choose"))
    temperature: float = spec(1.0, help="sampling temperature of training rollouts; the learner's policy "
                                             "log-probs are taken at it (0: at 1)", min=0)
    eval_temperature: float = spec(0.0, help="sampling temperature of held-out evaluation episodes (0: greedy; "
                                             "sampled ones use fixed per-episode seeds)", min=0)
    max_new_tokens: int | None = spec(None, help="tokens one reply may have at most (generate mode; None: the "
                                                 "task's budget, TaskFormat.max_tokens)", min=1)
    max_turns: int = spec(64, help="turns per episode at most (the environment's own limit also applies)", min=1)
    system_prompt: str | None = spec(None, help="system message of rollouts, SFT demonstrations and the held-out "
                                                "pool (None: the task's, its instruction after a one-line intro; "
                                                "'' (YAML's empty string): no system message)")
    max_episode_tokens: int = spec(4096, help="an episode whose context would pass this many tokens ends there "
                                              "(truncated, like a time limit), so one long episode cannot "
                                              "exhaust the learner's memory", min=2)
    activation_checkpointing: bool = spec(True, help="recompute each layer's activations in the backward pass "
                                                     "(memory ~1/layers for ~30% more compute)")
    compute_dtype: str = spec("float32", help="precision of the learner's transformer body and of the engine's "
                                              "weights: bfloat16 runs them in bf16 (autocast; fp32 master weights, "
                                              "optimiser and LM head), ~3x faster on CPUs with AVX512-BF16 or AMX; "
                                              "float32 is exact (the engine equals transformers generate)",
                              choices=("float32", "bfloat16"))
    learner_token_budget: int = spec(8192, help="tokens (rows x padded length) per learner forward pass; a larger "
                                                "batch runs as micro-batches with the same gradient", min=1)
    learner_chunk_tokens: int = spec(1024, help="positions per LM-head chunk in the learner (no [B, L, V] logits "
                                                "tensor is built); smaller saves memory, same log-probs", min=1)
    clip: float = spec(0.2, help="PPO/GRPO ratio clip epsilon (both sides)", gt=0)
    advantage_scale: str = spec("std", help="grpo: group advantages divided by the group's std, or none "
                                            "(Dr. GRPO: centred only)", choices=("std", "none"))
    pg_reduction: str = spec("token_mean", help="policy-gradient loss averaged over every action token of the "
                                                "batch, or per episode then over episodes",
                             choices=("token_mean", "sequence_mean"))
    ce_target: str = spec("env_only", help="echo-rl: tokens the env-output CE predicts",
                          choices=("env_only", "warning_only", "warning_plus_env"))
    ce_normalization: str = spec("sequence", help="echo-rl: env-output CE divided per episode by its env-output "
                                                  "length |O|, or averaged over every target token",
                                 choices=("sequence", "token_mean"))
    max_grad_norm: float = spec(1.0, help="gradient-norm clip of the language model", gt=0)
    max_staleness: int = spec(1, help="policy versions a trajectory may lag behind the learner", min=0)
    kl_coef: float = spec(0.0, help="weight of the k3 KL to the policy the RL phase started from (after SFT); "
                                    "0: no reference model, no KL term", min=0)
    sft_episodes: int | None = spec(None, help="expert episodes for the SFT warm start (0: no warm start; None: 16 "
                                               "for a tiny random backbone, 48 for a pretrained one)", min=0)
    sft_steps: int | None = spec(None, help="SFT optimiser steps on those episodes (None: 20 for a tiny random "
                                            "backbone, 18 for a pretrained one)", min=0)
    sft_learning_rate: float | None = spec(None, help="learning rate of the SFT warm start (None: 3e-3 for a tiny "
                                                      "random backbone, 5e-5 for a pretrained one)", gt=0)
    sft_batch_episodes: int | None = spec(None, help="expert episodes per SFT step, drawn without replacement "
                                                     "and reshuffled each pass (0: every episode in every step; "
                                                     "None: 0 for a tiny random backbone, 8 for a pretrained "
                                                     "one); smaller batches give more updates for the same "
                                                     "compute", min=0)
    sft_cache_dir: str | None = spec(None, help="share SFT results between runs that differ only after SFT "
                                                "(e.g. a lambda sweep of one seed)")
    heldout_pool: int = spec(8, help="held-out expert episodes whose env-output CE is measured at each "
                                     "evaluation (0: none)", min=0)
    eval_env_config: dict = spec(default_factory=dict, help="environment overrides for held-out evaluation "
                                                            "(alfworld: split=valid_unseen unless given here)")
    sft_env_config: dict = spec(default_factory=dict, help="environment overrides for the SFT warm start's expert "
                                                           "episodes only (e.g. {level: 1}: demonstrate the easy "
                                                           "tasks, train RL on all of them)")
    extra_eval_env: str = spec("", help="a second held-out task evaluated at the first and last evaluation (e.g. "
                                        "intercode_bash, with the same turn protocol); empty: none")
    extra_eval_env_config: dict = spec(default_factory=dict, help="environment options of extra_eval_env")
    extra_eval_episodes: int = spec(0, help="extra_eval_env episodes, on tasks spread evenly over its task list",
                                    min=0)
    plan_tokens: int = spec(2, help="soft-prefix rows the latent plan becomes before each action", min=1)
    max_updates: int = spec(0, help="stop after this many learner updates (0: total_timesteps alone decides)",
                            min=0)
    eval_every_updates: int = spec(0, help="evaluate and checkpoint every this many updates (0: by "
                                           "evaluation_frequency / save_frequency env steps)", min=0)
    replay_updates: int = spec(0, help="extra learner steps per update on trajectories replayed from the hot/cold "
                                       "buffer (0: no replay; --no-replay also switches it off)", min=0)
    replay_batch: int = spec(8, help="trajectories per replayed learner step", min=1)
    replay_capacity: int = spec(256, help="trajectories the replay keeps (older ones are evicted); the sampling "
                                          "rule comes from replay_config", min=2)
    replay_max_tokens: int = spec(2048, help="longest trajectory the replay stores (longer ones are not replayed)",
                                  min=1)
    objective: str = spec("grpo", help="policy objective: grpo (group-relative advantages, no critic), gigpo "
                                       "(grpo + step-level advantages over anchor states), ppo-rlhf (value head + "
                                       "GAE) or one registered with register_lm_objective; the ECHO term adds to "
                                       "each")
    gae_level: str = spec("turn", help="ppo-rlhf: GAE steps are turns or action tokens", choices=("turn", "token"))
    gamma: float = spec(1.0, help="ppo-rlhf: discount per GAE step", min=0, max=1)
    gae_lambda: float = spec(0.95, help="ppo-rlhf: GAE lambda", min=0, max=1)
    vf_coef: float = spec(0.5, help="ppo-rlhf: weight of the value loss", min=0)
    value_clip: float = spec(0.2, help="ppo-rlhf: clip of the value change (0: unclipped)", min=0)
    gigpo_gamma: float = spec(0.95, help="gigpo: discount of the step returns compared within an anchor-state "
                                         "group", min=0, max=1)
    gigpo_omega: float = spec(1.0, help="gigpo: weight of the step-level advantage (A = A_episode + omega * A_step)",
                              min=0, max=1e6)
    gigpo_norm: str = spec("std", help="gigpo: divide both levels by their group's std, or none (mean-centred "
                                       "only, the paper's variant without std)", choices=("std", "none"))
    gigpo_similarity: float | None = spec(None, help="gigpo: anchor states match by identity (None) or when their "
                                                     "difflib similarity ratio is >= this, in (0, 1]", gt=0, max=1)
    reward: str = spec("env", help="reward source: env, rlaif (the AI judge's score alone) or mix "
                                   "((1 - judge_weight)·env + judge_weight·judge)", choices=("env", "rlaif", "mix"))
    judge_backbone: str | None = spec(None, help="rlaif/mix: the judge: tiny, tiny:<preset>, a local checkpoint, or "
                                                 "an API model (needs its client library and key)")
    judge_rubric: str = spec("", help="rlaif/mix: the rubric the judge scores against (empty: the built-in one)")
    judge_mode: str = spec("likelihood", help="rlaif/mix: likelihood (expected score under the judge) or generate "
                                              "(parse 'Score: N/M' from a greedy reply)",
                           choices=("likelihood", "generate"))
    judge_weight: float = spec(0.5, help="mix: weight of the judge's score", min=0, max=1)
    lora_rank: int = spec(0, help="train LoRA adapters of this rank instead of every weight (0: full fine-tuning; "
                                  "needs pip install 'echo-rl[lora]')", min=0)
    lora_alpha: float = spec(32.0, help="LoRA scaling numerator (updates are scaled by lora_alpha / lora_rank)", gt=0)
    lora_targets: str = spec("q_proj,k_proj,v_proj,o_proj", help="comma-separated module names that get LoRA "
                                                                  "adapters (Llama/Qwen attention projections)")

    def validate(self) -> None:
        if bool(self.extra_eval_env) != bool(self.extra_eval_episodes):
            self._fail("extra_eval_episodes", self.extra_eval_episodes, "must be > 0 exactly when extra_eval_env "
                                                                        "names a task")
        if self.lora_rank and not [t for t in self.lora_targets.split(",") if t.strip()]:
            self._fail("lora_targets", self.lora_targets, "name at least one module, e.g. q_proj,v_proj")
        if self.reward != "env" and not self.judge_backbone:
            self._fail("judge_backbone", self.judge_backbone, f"reward={self.reward!r} needs a judge: tiny, "
                                                              "tiny:<preset>, a local checkpoint or an API model")

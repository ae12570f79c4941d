"""Config dataclasses: validated on construction, YAML round-trip, dotted overrides.

Every field carries its rule in ``metadata`` (``help``, and optionally ``min``,
``max``, ``choices``, ``gt``) so that validation, ``--help`` and the docs all
read the same source. Invalid values raise :class:`ConfigError` with one line
naming the field, the value and what is allowed.

This is the ground floor: it imports nothing of ``echo_rl``. Names a config
holds but an upper floor owns (tasks, agents, loggers, backbones) are checked
by the rules their owners register here (:func:`register_name_rule`).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml


class ConfigError(ValueError):
    """A config value or file is invalid; the message is one line."""


def spec(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING,
         min: float | None = None, max: float | None = None, gt: float | None = None,
         choices: tuple | None = None) -> Any:
    """Declare a config field with its documentation and its validation rule."""
    meta = {"help": help, "min": min, "max": max, "gt": gt, "choices": choices}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin in (dict, Mapping):
        return isinstance(value, dict)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _coerce(value: Any, tp: Any) -> Any:
    """Turn YAML/CLI scalars into the declared type where that is lossless."""
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    numeric = [a for a in (typing.get_args(tp) or (tp,)) if a in (int, float)]
    if numeric and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-3" as a string
            return numeric[-1](value)
        except ValueError:
            return value
    if typing.get_origin(tp) is tuple and isinstance(value, list):
        return tuple(value)
    return value


@dataclass
class ConfigBase:
    """Base of every EchoRL config: validation, dict/YAML round-trip, overrides."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            tp = hints[f.name]
            value = _coerce(getattr(self, f.name), tp)
            if isinstance(value, dict) and isinstance(tp, type) and issubclass(tp, ConfigBase):
                value = tp.from_dict(value, prefix=f"{self._name()}.{f.name}")
            object.__setattr__(self, f.name, value)
            self._check(f, value, tp)
        self.validate()

    # -- validation -------------------------------------------------------
    @classmethod
    def _name(cls) -> str:
        return cls.__name__

    def _fail(self, name: str, value: Any, allowed: str) -> None:
        raise ConfigError(f"{self._name()}.{name}={value!r} is invalid: {allowed}")

    def _check(self, f: dataclasses.Field, value: Any, tp: Any) -> None:
        if not _type_ok(value, tp):
            self._fail(f.name, value, f"expected {getattr(tp, '__name__', tp)}")
        meta = f.metadata
        if value is None or isinstance(value, (ConfigBase, dict, list, tuple, str, bool)):
            if meta.get("choices") is not None and value not in meta["choices"]:
                self._fail(f.name, value, f"allowed: {', '.join(map(str, meta['choices']))}")
            return
        if meta.get("min") is not None and value < meta["min"]:
            self._fail(f.name, value, f"must be >= {meta['min']}")
        if meta.get("gt") is not None and value <= meta["gt"]:
            self._fail(f.name, value, f"must be > {meta['gt']}")
        if meta.get("max") is not None and value > meta["max"]:
            self._fail(f.name, value, f"must be <= {meta['max']}")
        if isinstance(value, float) and value != value:
            self._fail(f.name, value, "must not be NaN")

    def validate(self) -> None:
        """Cross-field checks; override in subclasses."""

    # -- conversion -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, ConfigBase):
                v = v.to_dict()
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], prefix: str | None = None) -> "ConfigBase":
        prefix = prefix or cls._name()
        if not isinstance(data, Mapping):
            raise ConfigError(f"{prefix} must be a mapping, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown field {prefix}.{unknown[0]}; allowed: {', '.join(sorted(names))}")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for k, v in data.items():
            tp = hints[k]
            if isinstance(tp, type) and issubclass(tp, ConfigBase) and isinstance(v, Mapping):
                v = tp.from_dict(v, prefix=f"{prefix}.{k}")
            kwargs[k] = v
        return cls(**kwargs)

    def replace(self, **changes: Any) -> "ConfigBase":
        return dataclasses.replace(self, **changes)

    # -- YAML -------------------------------------------------------------
    def save_yaml(self, path: str | os.PathLike) -> None:
        """Write atomically so a crash never leaves half a config."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".yaml")
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(self.to_dict(), fh, sort_keys=False)
        os.replace(tmp, path)

    @classmethod
    def load_yaml(cls, path: str | os.PathLike) -> "ConfigBase":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or "malformed YAML"
            raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
        return cls.from_dict(data or {}, prefix=cls._name())

    # -- overrides --------------------------------------------------------
    def with_overrides(self, overrides: Mapping[str, Any]) -> "ConfigBase":
        """Apply ``{"ppo_config.learning_rate": 1e-3, ...}``; values may be YAML strings."""
        data = self.to_dict()
        for key, raw in overrides.items():
            value = yaml.safe_load(raw) if isinstance(raw, str) else raw
            node, parts = data, key.split(".")
            for i, part in enumerate(parts):
                if not isinstance(node, dict) or part not in node:
                    scope = ".".join([self._name(), *parts[:i]])
                    allowed = ", ".join(sorted(node)) if isinstance(node, dict) else "none"
                    raise ConfigError(f"unknown field {scope}.{part}; allowed: {allowed}")
                if i == len(parts) - 1:
                    node[part] = value
                else:
                    node = node[part]
        return type(self).from_dict(data)


def parse_override(text: str) -> tuple[str, str]:
    """Split a ``key=value`` CLI override."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like field.path=value")
    key, value = text.split("=", 1)
    return key.strip(), value


# ---------------------------------------------------------------------------
# Component configs. Each is owned by its module (named in the docstring);
# they live here so one file documents every knob a run can turn.
# ---------------------------------------------------------------------------

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
    anneal_lr: bool = spec(True, help="anneal the learning rate linearly to 0 over training")

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


@dataclass
class BandwidthConfig(ConfigBase):
    """Bandwidth accounting and scheduling (``echo_rl.core.bandwidth``)."""

    scale: float = spec(1.0, help="cost scale in b(s_1:t) = scale * t(t+1)/2", gt=0)
    epsilon: float = spec(1e-6, help="epsilon in priority = r / (w*b_eff + q + eps)", gt=0)
    bandwidth_weight: float = spec(1.0, help="w: weight of b_eff in the scheduler's priority denominator "
                                             "(0: rank by reward per queueing cost alone)", min=0)
    pg_loss_weight: float = spec(1.0, help="w in eta_bw's denominator term w*|l_PG|", min=0)


@dataclass
class EchoAgentConfig(ConfigBase):
    """The EchoRL vector agent's parts (``echo_rl.training.echo_agent``); each one can be switched off.

    The V-trace clip thresholds are also what the IMPALA baseline uses.
    """

    latent_plan: bool = spec(True, help="condition the policy on the latent plan (False: no plan encoder, no KL)")
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
    """Language-model agents on text tasks (``echo_rl.training.lm``; guide: docs/lm_training.md).

    On a text task ``--agent ppo`` trains GRPO (PPO's clipped ratio with group-relative
    advantages, no critic) and ``--agent echo-rl`` adds the ECHO env-output CE
    (``env_loss_coef``) and the latent plan as soft-prefix embeddings (``--no-plan``,
    ``--no-kl``, ``--no-world-model`` switch those off).
    """

    env_loss_coef: float = spec(0.05, help="lambda: weight of the ECHO env-output CE for --agent echo-rl", min=0)
    learning_rate: float | None = spec(None, help="AdamW learning rate of the language model during RL (None: 1e-4 "
                                                  "for a tiny random backbone, 1e-5 for a pretrained one)", gt=0)
    group_size: int = spec(4, help="episodes per task seed (one GRPO group); num_actors must be a multiple", min=1)
    action_mode: str = spec("generate", help="generate: free text, first line parsed; choose: pick among the "
                                             "admissible actions by likelihood", choices=("generate", "choose"))
    temperature: float = spec(1.0, help="sampling temperature of training rollouts", min=0)
    eval_temperature: float = spec(0.0, help="sampling temperature of held-out evaluation episodes (0: greedy; "
                                             "sampled ones use fixed per-episode seeds)", min=0)
    max_new_tokens: int = spec(16, help="tokens one reply may have at most (generate mode)", min=1)
    max_turns: int = spec(64, help="turns per episode at most (the environment's own limit also applies)", min=1)
    max_episode_tokens: int = spec(4096, help="an episode whose context would pass this many tokens ends there "
                                              "(truncated, like a time limit), so one long episode cannot "
                                              "exhaust the learner's memory", min=2)
    activation_checkpointing: bool = spec(True, help="recompute each layer's activations in the backward pass "
                                                     "(memory ~1/layers for ~30% more compute)")
    learner_token_budget: int = spec(8192, help="tokens (rows x padded length) per learner forward pass; a larger "
                                                "batch runs as micro-batches with the same gradient", min=1)
    clip: float = spec(0.2, help="PPO/GRPO ratio clip epsilon (both sides)", gt=0)
    max_grad_norm: float = spec(1.0, help="gradient-norm clip of the language model", gt=0)
    max_staleness: int = spec(1, help="policy versions a trajectory may lag behind the learner", min=0)
    kl_coef: float = spec(0.0, help="weight of the k3 KL to the policy the RL phase started from (after SFT); "
                                    "0: no reference model, no KL term", min=0)
    sft_episodes: int | None = spec(None, help="expert episodes for the SFT warm start (0: no warm start; None: 16 "
                                               "for a tiny random backbone, 8 for a pretrained one)", min=0)
    sft_steps: int | None = spec(None, help="SFT optimiser steps on those episodes (None: 20 for a tiny random "
                                            "backbone, 4 for a pretrained one)", min=0)
    sft_learning_rate: float | None = spec(None, help="learning rate of the SFT warm start (None: 3e-3 for a tiny "
                                                      "random backbone, 3e-5 for a pretrained one)", gt=0)
    sft_cache_dir: str | None = spec(None, help="share SFT results between runs that differ only after SFT "
                                                "(e.g. a lambda sweep of one seed)")
    heldout_pool: int = spec(8, help="held-out expert episodes whose env-output CE is measured at each "
                                     "evaluation (0: none)", min=0)
    eval_env_config: dict = spec(default_factory=dict, help="environment overrides for held-out evaluation "
                                                            "(alfworld: split=valid_unseen unless given here)")
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
    objective: str = spec("grpo", help="policy objective: grpo (group-relative advantages, no critic) or ppo-rlhf "
                                       "(value head + GAE); the ECHO term adds to either",
                          choices=("grpo", "ppo-rlhf"))
    gae_level: str = spec("turn", help="ppo-rlhf: GAE steps are turns or action tokens", choices=("turn", "token"))
    gamma: float = spec(1.0, help="ppo-rlhf: discount per GAE step", min=0, max=1)
    gae_lambda: float = spec(0.95, help="ppo-rlhf: GAE lambda", min=0, max=1)
    vf_coef: float = spec(0.5, help="ppo-rlhf: weight of the value loss", min=0)
    value_clip: float = spec(0.2, help="ppo-rlhf: clip of the value change (0: unclipped)", min=0)
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
        if self.lora_rank and not [t for t in self.lora_targets.split(",") if t.strip()]:
            self._fail("lora_targets", self.lora_targets, "name at least one module, e.g. q_proj,v_proj")
        if self.reward != "env" and not self.judge_backbone:
            self._fail("judge_backbone", self.judge_backbone, f"reward={self.reward!r} needs a judge: tiny, "
                                                              "tiny:<preset>, a local checkpoint or an API model")


# -- name rules: registered by the floors that own the names --------------------------------------------------
# Each owner registers its rule when imported, and ``echo_rl/__init__`` imports every owner; Python runs it
# before any ``echo_rl.config`` import, so a TrainingConfig is never validated without them.
NAME_RULES: dict[str, str] = {
    "task": "task(env_name): raise ConfigError for an unknown task (echo_rl.environments.registry)",
    "vector_task": "vector_task(env_name) -> bool: a MiniGrid task, else a text task (echo_rl.environments.registry)",
    "agent": "agent(name): raise ConfigError for an unknown agent (echo_rl.training.agents)",
    "loggers": "loggers(loggers, tracking): raise ConfigError for unknown loggers/options (echo_rl.utils.tracking)",
    "default_backbone": "default_backbone() -> (name, None or how to fetch it): text tasks' default backbone "
                        "(echo_rl.models.fetch)",
    "api_backbone": "api_backbone(name) -> bool: an API model, which has no weights to train (echo_rl.models.api)",
}
_name_rules: dict[str, Callable[..., Any]] = {}


def register_name_rule(rule: str, fn: Callable[..., Any]) -> None:
    """Install the owner's rule for names a config holds (:data:`NAME_RULES`); registering again replaces it."""
    if rule not in NAME_RULES:
        raise ValueError(f"unknown name rule {rule!r}; allowed: {', '.join(NAME_RULES)}")
    if not callable(fn):
        raise TypeError(f"name rule {rule!r} must be callable, got {type(fn).__name__}")
    _name_rules[rule] = fn


def name_rule(rule: str) -> Callable[..., Any]:
    if rule not in _name_rules:
        raise RuntimeError(f"no {rule!r} name rule is registered ({NAME_RULES[rule]}); it registers on import "
                           f"of its owner, which 'import echo_rl' imports")
    return _name_rules[rule]


# Names of the vector policy's parts; their owners (echo_rl.models.encoders / .augmentation) build them.
ENCODER_NAMES = (None, "mlp", "minigrid", "minigrid_cnn", "nature_cnn", "impala_cnn")
AUGMENTATION_NAMES = (None, "random_shift", "random_crop", "color_jitter")


@dataclass
class TrainingConfig(ConfigBase):
    """One training run (``echo_rl.training.trainer``); a run is a function of (config, seed).

    ``batch_size`` is the number of transitions per learner update: for the
    on-policy PPO agent, ``num_actors`` environments each step
    ``batch_size // num_actors`` times between updates. ``train_frequency`` is
    how many environment steps (summed over actors) pass between updates; for
    on-policy agents it is ``batch_size`` by definition and may be left unset.
    """

    env_name: str = spec("minigrid", help="task: minigrid[:EnvId] or a full MiniGrid env id, CartPole-v1 / "
                                          "gym:<EnvId>, minigrid-pixels:<EnvId>, atari:<Game>, or a text task")
    env_config: dict = spec(default_factory=dict, help="keyword arguments for the environment factory")
    agent: str = spec("ppo", help="learning agent")
    backbone: str | None = spec(None, help="language-model backbone for text tasks (None for vector tasks)")
    total_timesteps: int = spec(1_000_000, help="environment steps to train for (summed over actors)", min=1)
    learning_starts: int = spec(0, help="environment steps before the first learner update", min=0)
    train_frequency: int | None = spec(None, help="env steps between learner updates (None: batch_size)")
    evaluation_frequency: int = spec(50_000, help="env steps between evaluations (0: only at the end)", min=0)
    evaluation_episodes: int = spec(100, help="episodes per evaluation", min=1)
    save_frequency: int = spec(50_000, help="env steps between checkpoints (0: only at the end)", min=0)
    num_actors: int = spec(8, help="parallel environments / actors", min=1)
    vector_env: str = spec("sync", help="step the actors' envs in this process (sync) or in worker processes "
                                        "(async: gymnasium AsyncVectorEnv; pays off when env steps dominate)",
                           choices=("sync", "async"))
    policy_network: str = spec("minigrid", help="vector policy network: minigrid (per-cell embeddings) or mlp "
                                                "(flat input, 64x64 like Stable-Baselines3's MlpPolicy)",
                               choices=("minigrid", "mlp"))
    encoder: str | None = spec(None, help="observation encoder of the vector policy (echo_rl.models.encoders): mlp, "
                                          "minigrid (per-cell embeddings), minigrid_cnn (7x7x3 grid), nature_cnn or "
                                          "impala_cnn (pixels); None: policy_network on symbolic MiniGrid, mlp on flat "
                                          "vectors, nature_cnn on images", choices=ENCODER_NAMES)
    augmentation: str | None = spec(None, help="augmentation of pixel observations in the learner "
                                               "(echo_rl.models.augmentation; None: off)", choices=AUGMENTATION_NAMES)
    intrinsic_reward: str | None = spec(None, help="intrinsic reward module added to the task reward after each "
                                                   "rollout (echo_rl.intrinsic, e.g. rnd; None: off)")
    intrinsic_config: dict = spec(default_factory=dict, help="keyword arguments of the intrinsic reward module")
    intrinsic_beta: float = spec(0.05, help="weight of the intrinsic reward at step 0", min=0)
    intrinsic_kappa: float = spec(0.0, help="decay of that weight per env step: beta * (1 - kappa)^step "
                                       "(0: constant)", min=0, max=1)
    intrinsic_normalize: bool = spec(True, help="normalise the intrinsic reward by its running std before mixing")
    pretraining: bool = spec(False, help="train on the intrinsic reward alone (the task reward is ignored); "
                                         "fine-tune later with init_from")
    init_from: str | None = spec(None, help="run directory whose newest checkpoint's network weights start this run "
                                            "(fine-tuning after pretraining; optimiser and counters start fresh)")
    num_learners: int = spec(1, help="data-parallel learner processes (torch.distributed; ppo on vector tasks, "
                                      "num_actors a multiple of it; echo_rl.distributed.data_parallel)", min=1)
    backend: str = spec("local", help="where actors and learner run: local (this process) or ray "
                                      "(Ray actors; needs the distributed extra)", choices=("local", "ray"))
    ray_address: str | None = spec(None, help="Ray cluster address for backend=ray (None: start a local Ray)")
    ray_num_workers: int | None = spec(None, help="Ray rollout actors for backend=ray, each owning a slice of "
                                                  "the num_actors envs (None: num_actors // 8, at least 1)")
    batch_size: int = spec(1024, help="transitions per learner update", min=1)
    device: str = spec("cpu", help="torch device: cpu, cuda, cuda:N or mps")
    torch_threads: int = spec(1, help="torch intra-op CPU threads while training (0: torch's default); small "
                                      "policies run fastest on 1, and more threads collapse under CPU contention",
                              min=0)
    seed: int = spec(0, help="seed of the whole run", min=0)
    checkpoint_dir: str = spec("checkpoints", help="checkpoint folder (relative paths are inside the run dir)")
    results_dir: str = spec("runs", help="parent folder of run directories when no run dir is given")
    tensorboard_dir: str = spec("tensorboard", help="TensorBoard folder (relative paths are inside the run dir)")
    loggers: list = spec(default_factory=lambda: ["tensorboard"], help="where metric rows go besides metrics.jsonl: "
                         "tensorboard, wandb, mlflow (wandb/mlflow: pip install 'echo-rl[tracking]')")
    tracking: dict = spec(default_factory=dict, help="logger options: wandb_project, wandb_entity, wandb_mode, "
                          "wandb_tags, mlflow_tracking_uri, mlflow_experiment (echo_rl.utils.tracking)")
    planning_config: PlanningConfig = spec(default_factory=PlanningConfig, help="latent planning")
    execution_config: ExecutionConfig = spec(default_factory=ExecutionConfig, help="execution engine")
    replay_config: ReplayConfig = spec(default_factory=ReplayConfig, help="prioritized replay")
    ppo_config: PPOConfig = spec(default_factory=PPOConfig, help="PPO learner")
    bandwidth_config: BandwidthConfig = spec(default_factory=BandwidthConfig, help="bandwidth accounting")
    echo_config: EchoAgentConfig = spec(default_factory=EchoAgentConfig, help="EchoRL vector agent parts")
    lm_config: LMConfig = spec(default_factory=LMConfig, help="language-model agents on text tasks")

    @property
    def text_task(self) -> bool:
        """Trained as a language-model agent: a text-only task, or MiniGrid with a backbone (as text)."""
        return not name_rule("vector_task")(self.env_name) or self.backbone is not None

    def validate(self) -> None:
        name_rule("task")(self.env_name)
        name_rule("agent")(self.agent)
        name_rule("loggers")(self.loggers, self.tracking)
        if self.text_task:
            self._validate_text()
        if not (self.device == "cpu" or self.device == "mps" or self.device.startswith("cuda")):
            self._fail("device", self.device, "allowed: cpu, cuda, cuda:N, mps")
        if self.batch_size % self.num_actors:
            self._fail("batch_size", self.batch_size, f"must be a multiple of num_actors={self.num_actors}")
        if self.train_frequency is not None and self.train_frequency < 1:
            self._fail("train_frequency", self.train_frequency, "must be >= 1 or None")
        if self.agent == "echo-rl" and not self.text_task:
            for name in ("encoder", "augmentation", "intrinsic_reward", "init_from"):
                if getattr(self, name) is not None:
                    self._fail(name, getattr(self, name), "is a part of the ppo and impala agents; the echo-rl "
                                                          "agent does not take it yet")
        if self.pretraining and not self.intrinsic_reward:
            self._fail("pretraining", True, "pre-training trains on the intrinsic reward alone: set intrinsic_reward "
                                            "(e.g. rnd)")
        if self.ray_num_workers is not None and not 1 <= self.ray_num_workers <= self.num_actors:
            self._fail("ray_num_workers", self.ray_num_workers, f"must be between 1 and num_actors={self.num_actors}")

    def _validate_text(self) -> None:
        if self.backbone is None:  # the registered pretrained model is the default, once fetched
            default, fetch_hint = name_rule("default_backbone")()
            if fetch_hint is not None:
                self._fail("backbone", None, f"text task {self.env_name!r} needs a language-model backbone: tiny, "
                                             f"tiny:<preset>, a local checkpoint directory or {default} (the "
                                             f"default once fetched: {fetch_hint})")
            self.backbone = default
        if name_rule("api_backbone")(self.backbone):
            self._fail("backbone", self.backbone, "an API model has no weights to train; training supports tiny, "
                                                  "tiny:<preset> or a local checkpoint directory (API models run "
                                                  "in echo-rl benchmark / the react and tot agents)")
        if self.agent not in ("ppo", "echo-rl"):
            self._fail("agent", self.agent, "text tasks train with ppo (GRPO) or echo-rl (ECHO + latent plan)")
        if self.backend != "local":
            self._fail("backend", self.backend, "text tasks run on the local backend only")
        if self.num_actors % self.lm_config.group_size:
            self._fail("num_actors", self.num_actors,
                       f"must be a multiple of lm_config.group_size={self.lm_config.group_size} (whole GRPO groups)")
        self._refuse_vector_only_parts()
        for name in ("encoder", "augmentation", "intrinsic_reward", "init_from"):
            if getattr(self, name) is not None:
                self._fail(name, getattr(self, name), "acts on vector tasks only (text tasks train a language model)")

    def _refuse_vector_only_parts(self) -> None:
        """A knob the LM agent never reads must not look as if it acted (e.g. ``--no-self-imitation``)."""
        default = EchoAgentConfig()
        switches = {"world_model_coef": "ECHO's env-token loss (its weight: lm_config.env_loss_coef)",
                    "replay_updates": "trajectory replay (its updates: lm_config.replay_updates)"}
        for name, what in switches.items():
            value, on = getattr(self.echo_config, name), getattr(default, name)
            if value not in (0, on):
                self._fail(f"echo_config.{name}", value, f"on text tasks it only switches {what} off (0) or on ({on})")
        for name in ("self_imitation_updates", "self_imitation_value_coef", "self_imitation_capacity",
                     "replay_batch_sequences", "sequence_length", "vtrace_rho_bar",
                     "vtrace_c_bar", "hidden_dim"):
            if getattr(self.echo_config, name) != getattr(default, name):
                self._fail(f"echo_config.{name}", getattr(self.echo_config, name),
                           "acts on the vector agent only; text tasks use lm_config (trajectory replay: "
                           "lm_config.replay_*)")

    @property
    def steps_per_update(self) -> int:
        return self.train_frequency or self.batch_size

"""TrainingConfig: one training run, the config every ``echo-rl train`` reads and saves as ``config.yaml``."""

from __future__ import annotations

from dataclasses import dataclass

from echo_rl.config.base import ConfigBase, load_yaml_text, spec
from echo_rl.config.components import (
    BandwidthConfig,
    DQNConfig,
    EchoAgentConfig,
    ExecutionConfig,
    LMConfig,
    PlanningConfig,
    PPOConfig,
    ReplayConfig,
    with_saved_defaults,
)
from echo_rl.config.names import AUGMENTATION_NAMES, ENCODER_NAMES, name_rule


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
    evaluation_deterministic: bool = spec(False, help="evaluate with the policy's mode instead of sampling "
                                                      "(argmax action, the Gaussian's mean, EchoRL's plan mean; "
                                                      "DQN: greedy), as SB3's deterministic=True")
    save_frequency: int = spec(50_000, help="env steps between checkpoints (0: only at the end)", min=0)
    keep_checkpoints: int = spec(3, help="newest checkpoints a run directory keeps (older ones are deleted after "
                                         "each save; with 1 an unreadable newest one leaves nothing to fall back "
                                         "to); a 135M-parameter LM run's checkpoint is ~1.6 GB", min=1)
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
    max_policy_lag: int | None = spec(None, help="asynchronous collection (impala; text tasks on Ray): actors keep "
                                                 "collecting while the learner updates, and unrolls (trajectories) "
                                                 "more than this many updates old are dropped, impala's rest "
                                                 "V-trace-corrected (None or 0: synchronous)",
                                      min=0)
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
    dqn_config: DQNConfig = spec(default_factory=DQNConfig, help="the dqn agent's learner (off-policy, replay service)")

    @classmethod
    def from_saved(cls, data) -> "TrainingConfig":
        """A config written earlier (a run directory's config.yaml, an exported policy's metadata): a field whose
        default has changed since (``components.SAVED_DEFAULTS``) keeps the value it was saved under."""
        return cls.from_dict(with_saved_defaults(data))

    @classmethod
    def from_saved_yaml_text(cls, text: str, source: str) -> "TrainingConfig":
        return cls.from_saved(load_yaml_text(text, source) or {})

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
        if self.agent == "echo-rl" and not self.text_task and self.augmentation is not None:
            self._fail("augmentation", self.augmentation, "acts on pixel observations; the echo-rl agent reads "
                                                          "MiniGrid's symbolic observation (plan windows and world "
                                                          "model are built on its grid tokens)")
        if self.pretraining and not self.intrinsic_reward:
            self._fail("pretraining", True, "pre-training trains on the intrinsic reward alone: set intrinsic_reward "
                                            "(e.g. rnd)")
        if self.ray_num_workers is not None and not 1 <= self.ray_num_workers <= self.num_actors:
            self._fail("ray_num_workers", self.ray_num_workers, f"must be between 1 and num_actors={self.num_actors}")
        if self.max_policy_lag and self.agent != "impala" and not self.text_task:
            self._fail("max_policy_lag", self.max_policy_lag, f"asynchronous collection is built for the impala agent "
                                                              f"(V-trace); agent={self.agent!r} collects synchronously")

    def _validate_text(self) -> None:
        objectives = name_rule("lm_objective")()
        if self.lm_config.objective not in objectives:
            self.lm_config._fail("objective", self.lm_config.objective, f"allowed: {', '.join(objectives)} (register "
                                 f"your own with echo_rl.lm.objectives.register_lm_objective)")
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
            self._fail("agent", self.agent, "text tasks train with ppo (GRPO) or echo-rl (ECHO; --plan adds the "
                                            "latent plan)")
        groups = self.num_actors // max(1, self.lm_config.group_size)
        if self.backend == "ray" and self.ray_num_workers is not None and self.ray_num_workers > max(1, groups):
            self._fail("ray_num_workers", self.ray_num_workers, f"text tasks split whole GRPO groups over the workers: "
                                                                f"at most num_actors / lm_config.group_size = {groups}")
        if self.max_policy_lag and self.backend != "ray":
            self._fail("max_policy_lag", self.max_policy_lag, "text tasks generate ahead of the learner on Ray "
                                                              "workers only: add backend=ray")
        if self.max_policy_lag and self.max_policy_lag > self.lm_config.max_staleness:
            self._fail("max_policy_lag", self.max_policy_lag, f"the learner refuses trajectories more than "
                                                              f"lm_config.max_staleness={self.lm_config.max_staleness}"
                                                              f" versions old: raise it too")
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

"""The EchoRL agent for vector environments: PPO + self-imitation + prioritized replay + world model (+ latent plan).

Acme's split: :mod:`.actor` acts (the plan path) as a step actor of the shared
``VectorRolloutCollector``; :mod:`.adder` writes rollouts into the replay and the
self-imitation store; :mod:`.learner` updates the weights (PPO's update from
``vector/ppo_update.py`` plus the plan, replay and self-imitation terms);
:mod:`.model` holds the networks; :mod:`.agent` joins them for the trainer.

Why PPO for the fresh data: it is the learner whose MiniGrid behaviour is best
documented (rl-starter-files, the SB3 zoo), so the parts EchoRL adds can be
measured against a strong, well-understood base.

One iteration:

1. **Act**: each env keeps its last k states (cut at episode starts); the plan
   encoder turns them into p(tau_t) = N(mu, sigma). The policy and value heads
   read the plan *mean*, detached (FiLM); the world model reads the sample
   tau = mu + sigma*eps (eps stored, so the learner rebuilds exactly that plan).
   Evaluation acts the same way, so the policy evaluated is the policy trained.
2. **PPO update** on the rollout: clipped surrogate + value loss − entropy
   + ``kl_weight`` · KL[p(tau_t) || p(tau_{t-1})] (pairs inside one episode)
   + ``world_model_coef`` · CE(next observation's image tokens | s_t, a_t, tau_t).
3. **Replay**: the rollout is cut into sequences of ``sequence_length`` steps
   (with the k states before each, for the plan windows) and added to the
   hot/cold buffer, scored by plan surprise ``||tau - tau_bar||^2 + alpha|r|``
   of the plans the actors used; ``replay_updates`` minibatches of sequences are
   then learned — value (V-trace targets for the current policy, clipped
   importance ratios, times the buffer's importance weights) and plan KL — and
   re-scored with the plans of that learning pass.
4. **Self-imitation** (``self_imitation.py``): the steps of episodes that
   terminated wait with their Monte Carlo return R in a prioritized store;
   ``self_imitation_updates`` minibatches learn -log pi(a|s)(R - V)+ plus a
   small value term, where R beat the critic — the one policy-gradient signal
   taken from old data, because it can only pull towards actions that did
   better than expected.

Two choices were made by measurement (DoorKey-8x8, the study's settings;
docs/results.md):

- **No policy gradient on replayed data.** An unclipped V-trace policy-gradient
  step on replayed sequences, and then GePPO's clipped surrogate
  (Queeney et al. 2021: ratio to the policy before this iteration's update
  clipped at ±clip_epsilon, times min(pi_old/mu, rho_bar) and V-trace advantages),
  both kept PPO + replay at 0.00–0.03 success on seeds where PPO alone reaches
  0.97–1.0 by 425k–575k steps. Stale sequences still teach the critic and the
  plan, which no trust region on the policy has to protect.
- **The policy reads a detached plan mean.** With the policy gradient flowing
  into the encoder through the sample (or only the sample detached) the policy's
  entropy fell to 1.58 by 100k steps in the reward-free phase (PPO: 1.74), the
  policy fitting the plan noise it was given; with the detached mean, 1.64–1.69.
  The encoder is trained by the world model and the plan KL only: the plan is a
  self-supervised summary of the last k states that the RL loss reads but does
  not shape.

The network is PPO's (``TrainingConfig.policy_network``: the same encoder, heads
and initialisation) with a zero-initialised FiLM layer between the encoder and
the heads, so each part is measured against exactly the PPO baseline.

Ablations (``echo_config`` / ``planning_config`` fields): ``latent_plan=false``
(no encoder, no KL), ``planning_config.kl_weight=0``, ``world_model_coef=0``,
``replay_updates=0``, ``self_imitation_updates=0``. All of them off is PPO: the
same network, initial weights, actions and updates as ``--agent ppo`` with that
seed (a test checks it).
"""

from echo_rl.vector.echo.agent import EchoAgent
from echo_rl.vector.echo.model import EchoModel, WorldModelHead, unfold_windows

__all__ = ["EchoAgent", "EchoModel", "WorldModelHead", "unfold_windows"]

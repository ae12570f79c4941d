"""The product description's Python snippets, run as written (device="cuda" -> "cpu"), with their numbers checked."""

import asyncio
import math

import numpy as np
import pytest
import torch

from echo_rl.config import ConfigError


# -- bandwidth ---------------------------------------------------------------------------------------------
def test_bandwidth_snippet(capsys):
    from echo_rl.core.bandwidth import BandwidthConfig, BandwidthEfficiencyTracker, BandwidthAwareScheduler
    from echo_rl.kernels import effective_bandwidth_cost, bandwidth_efficiency
    b_eff = effective_bandwidth_cost(seq_len=128, reuse_len=96, scale=1.0)
    scheduler = BandwidthAwareScheduler(BandwidthConfig(bandwidth_weight=1.0))
    priority = scheduler.compute_priority(reward=1.0, seq_len=128, queue_time=0.5, reuse_len=96)
    tracker = BandwidthEfficiencyTracker()
    tracker.record_rollout_step(reward=0.5, seq_len=64, reuse_len=48)
    tracker.record_learner_update(weighted_pg_loss=0.02)
    metrics = tracker.snapshot()
    print(f"η_bw = {metrics.eta_bw:.4f}, saved = {metrics.total_bandwidth_saved:.2f}")

    assert b_eff == 128 * 129 / 2 - 96 * 97 / 2 == 3600
    assert priority == pytest.approx(1.0 / (3600 + 0.5 + 1e-6))
    b = 64 * 65 / 2 - 48 * 49 / 2  # 904: the open episode so far
    assert metrics.eta_bw == pytest.approx(0.5 / (b + 0.02)) == metrics["eta_bw"]
    assert metrics.total_bandwidth_saved == 48 * 49 / 2
    assert capsys.readouterr().out == f"η_bw = {0.5 / (b + 0.02):.4f}, saved = 1176.00\n"
    assert bandwidth_efficiency([0.5], [b], [0.02]) == pytest.approx(metrics.eta_bw)
    with pytest.raises(AttributeError, match="no bandwidth metric 'eta'"):
        metrics.eta


def test_bandwidth_weight_and_keyword_names_act():
    from echo_rl.core.bandwidth import BandwidthAwareScheduler, BandwidthConfig
    from echo_rl.kernels import effective_bandwidth_cost

    args = dict(reward=1.0, seq_len=128, queue_time=0.5, reuse_len=96)
    assert BandwidthAwareScheduler(BandwidthConfig(bandwidth_weight=0.0)).compute_priority(**args) == \
        pytest.approx(1.0 / (0.5 + 1e-6))
    assert BandwidthAwareScheduler(BandwidthConfig(bandwidth_weight=2.0)).compute_priority(**args) == \
        pytest.approx(1.0 / (7200.5 + 1e-6))
    # the weight can reorder requests: a cheap low-reward one beats an expensive high-reward one only when
    # bandwidth counts
    order = [BandwidthAwareScheduler(BandwidthConfig(bandwidth_weight=w)).order([1.0, 3.0], [10, 100], [1.0, 1.0])
             .tolist() for w in (1.0, 0.0)]
    assert order == [[0, 1], [1, 0]]
    with pytest.raises(ConfigError, match="bandwidth_weight=-1.0 is invalid"):
        BandwidthConfig(bandwidth_weight=-1.0)
    assert effective_bandwidth_cost(128, 96) == effective_bandwidth_cost(t=128, t_prefix=96) == 3600
    assert effective_bandwidth_cost(seq_len=10) == 55
    with pytest.raises(TypeError, match="pass t or seq_len, not both"):
        effective_bandwidth_cost(10, seq_len=10)


def test_tracker_counts_only_closed_episodes_once_one_ends():
    from echo_rl.core.bandwidth import BandwidthEfficiencyTracker

    t = BandwidthEfficiencyTracker()
    assert math.isnan(t.snapshot().eta_bw)
    t.record_rollout_step(1.0, 4, 0, episode_end=True)  # R=1, B=10
    t.record_rollout_step(5.0, 3, 0)  # open: not in the average any more
    assert t.snapshot().eta_bw == pytest.approx(1 / 10) and t.snapshot().episodes == 1


def test_kernels_available():
    from echo_rl.kernels import kernels_available, kernels_status

    assert isinstance(kernels_available(), bool)
    assert kernels_available() == kernels_status().startswith("compiled")


# -- latent planning -----------------------------------------------------------------------------------------
def test_latent_planning_snippet():
    from echo_rl.core import PlanningConfig
    from echo_rl.core.latent_planning import LatentPlanningOptimizer, PolicyNetwork, TrajectoryEncoder
    encoder = TrajectoryEncoder(state_dim=512, config=PlanningConfig())
    policy = PolicyNetwork(state_dim=512, action_dim=20, latent_dim=512)
    optimizer = LatentPlanningOptimizer(state_dim=512, action_dim=20, config=PlanningConfig())

    cfg = PlanningConfig(embedding_dim=512, state_window_size=8, kl_weight=0.1, learning_rate=3e-4)
    assert (cfg.embedding_dim, cfg.state_window_size, cfg.kl_weight, cfg.learning_rate) == (512, 8, 0.1, 3e-4)
    k = PlanningConfig().state_window_size
    windows, masks = torch.randn(3, k, 512), torch.ones(3, k, dtype=torch.bool)
    plan = encoder(windows, masks)
    assert plan.mean.shape == (3, PlanningConfig().embedding_dim)
    logits, value = policy(torch.randn(3, 512), torch.randn(3, 512))
    assert logits.shape == (3, 20) and value.shape == (3,)
    logits, value, dist, tau = optimizer.forward(torch.randn(3, 512), windows, masks, torch.zeros(3, 512))
    assert logits.shape == (3, 20) and torch.equal(tau, dist.mean)
    before = [p.clone() for p in optimizer.encoder.parameters()]
    loss = -logits.log_softmax(-1)[:, 0].mean() + cfg.kl_weight * optimizer.kl_loss(
        torch.randn(3, k + 1, 512), torch.ones(3, k + 1, dtype=torch.bool))
    optimizer.step(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, optimizer.encoder.parameters()))


# -- execution engine ----------------------------------------------------------------------------------------
def test_async_execution_snippet():
    from echo_rl.core import ExecutionConfig
    from echo_rl.core.async_execution import AsyncExecutionEngine, KVCacheManager  # noqa: F401
    cache_manager = KVCacheManager(config=ExecutionConfig())

    assert cache_manager.max_tokens == ExecutionConfig().max_cache_size
    cfg = ExecutionConfig(max_concurrent_rollouts=128, max_cache_size=10000, timeout=30.0)
    assert (cfg.max_concurrent_rollouts, cfg.max_cache_size, cfg.timeout) == (128, 10000, 30.0)
    # max_cache_size bounds what the cache holds: the least recently used prefix goes first
    small = KVCacheManager(config=ExecutionConfig(max_cache_size=6))
    rows = lambda n: torch.empty(n, *small.pool.row_shape)  # noqa: E731
    assert small.insert([1, 2, 3, 4], rows(4)) == 4 and small.match_length([1, 2, 3, 9]) == 3
    assert small.insert([7, 8, 9, 10], rows(4)) == 4 and small.cached_tokens == 4 and small.match_length([1]) == 0
    # with a model's geometry the memory budget also binds (4 layers * 2 heads * 64 dims * K,V * 4 bytes)
    sized = KVCacheManager(4, 2, 64, config=ExecutionConfig(kv_memory_budget_mb=1.0, max_cache_size=10**6))
    assert sized.max_tokens == 2**20 // (2 * 4 * 2 * 64 * 4)
    with pytest.raises(ConfigError, match="exceeds ExecutionConfig.max_cache_size=10"):
        KVCacheManager(1, 1, 0, 20, config=ExecutionConfig(max_cache_size=10))
    with pytest.raises(ConfigError, match="needs a model geometry"):
        KVCacheManager()


# -- replay --------------------------------------------------------------------------------------------------
def test_prioritized_replay_snippet():
    from echo_rl.core import ReplayConfig
    from echo_rl.core.prioritized_replay import HotColdBuffer, PrioritizedReplayBuffer, ReplayNotReadyError
    replay_buffer = PrioritizedReplayBuffer(config=ReplayConfig())

    with pytest.raises(ReplayNotReadyError, match="min_experiences=1000"):
        replay_buffer.sample_batch(batch_size=256, temperature=1.0)
    rng = np.random.default_rng(0)
    for i in range(1000):  # one plan far from the rest: the surprising one
        plan = np.full(8, 10.0 if i == 500 else 0.0, np.float32) + rng.normal(0, 0.01, 8).astype(np.float32)
        replay_buffer.add_experience(rng.normal(size=4).astype(np.float32), plan, i % 3, 0.0,
                                     rng.normal(size=4).astype(np.float32), False)
    experiences, weights = replay_buffer.sample_batch(batch_size=256, temperature=1.0)

    assert replay_buffer.capacity == min(ReplayConfig().hot_buffer_size + ReplayConfig().cold_buffer_size,
                                         ReplayConfig().max_replay_age)
    assert replay_buffer.mode == "softmax" and experiences["state"].shape == (256, 4) and weights.shape == (256,)
    assert (experiences["indices"] == 500).sum() > 10  # softmax over plan surprise favours it
    cfg = ReplayConfig(hot_buffer_size=1000000, cold_buffer_size=10000000, age_threshold=1000, temperature=1.0)
    hc = HotColdBuffer(cfg)
    assert (hc.hot_capacity, hc.temperature) == (1000, 1.0)
    with pytest.raises(ValueError, match="pass config or capacity, not both"):
        PrioritizedReplayBuffer(10, config=ReplayConfig())


def test_ppo_config_snippet():
    from echo_rl.core import PPOConfig

    cfg = PPOConfig(learning_rate=3e-4, clip_epsilon=0.2, value_loss_coef=0.5, entropy_coef=0.01, kl_coef=0.1,
                    gae_lambda=0.95, gamma=0.99)
    assert (cfg.clip_epsilon, cfg.kl_coef, cfg.gamma) == (0.2, 0.1, 0.99)


# -- environments --------------------------------------------------------------------------------------------
def test_env_config_snippets(shared_data):
    from echo_rl.environments.arc import ARCConfig, ARCEnvironment
    from echo_rl.environments.cruxeval import CRUXEvalConfig, CRUXEvalEnvironment
    from echo_rl.environments.minigrid import MiniGridConfig, MiniGridEnvironment
    from echo_rl.environments.webshop import WebShopConfig, WebShopEnvironment

    config = WebShopConfig(website_type="electronics", budget_limit=1000.0)
    web = WebShopEnvironment(config)
    assert web.reset(seed=0)[0] and web.num_tasks < WebShopEnvironment(WebShopConfig()).num_tasks
    config = CRUXEvalConfig(language="python", max_code_length=1000)
    crux = CRUXEvalEnvironment(config)
    assert crux.reset(seed=0)[0] and crux.num_tasks <= CRUXEvalEnvironment(CRUXEvalConfig()).num_tasks
    assert CRUXEvalEnvironment(CRUXEvalConfig(max_code_length=150)).num_tasks < crux.num_tasks
    config = ARCConfig(grid_size=10, task_type="pattern_completion")
    arc = ARCEnvironment(config)
    assert arc.reset(seed=0)[0] and arc.num_tasks < ARCEnvironment(ARCConfig()).num_tasks
    config = MiniGridConfig(grid_size=8, task_type="key_door")
    grid = MiniGridEnvironment(config)
    assert grid.reset(seed=0)[1]["task_id"].startswith("MiniGrid-DoorKey-8x8")
    for bad, needle in [(lambda: CRUXEvalConfig(language="java"), "allowed: python"),
                        (lambda: MiniGridConfig(grid_size=7, task_type="key_door"), "key_door allows"),
                        (lambda: WebShopConfig(budget_limit=-1.0), "budget_limit"),
                        (lambda: ARCConfig(grid_size=0), "grid_size")]:
        with pytest.raises(ConfigError, match=needle):
            bad()


@pytest.mark.slow
def test_alfworld_config_snippet(shared_data):
    pytest.importorskip("textworld", reason="ALFWorld needs pip install 'echo-rl[alfworld]'")
    from echo_rl.environments.alfworld import ALFWorldConfig, ALFWorldEnvironment

    config = ALFWorldConfig(task_type="pick_and_place", max_objects=10)
    env = ALFWorldEnvironment(config)
    assert env.reset(seed=0)[1]["task_id"].startswith("pick_and_place_simple")


# -- monitoring ----------------------------------------------------------------------------------------------
def test_monitoring_snippet():
    pytest.importorskip("psutil")
    from echo_rl.utils.monitoring import MetricsCollector, PerformanceMonitor

    monitor = PerformanceMonitor(); monitor.start_monitoring()
    sum(i * i for i in range(200_000))
    performance_metrics = monitor.get_metrics()
    collector = MetricsCollector(); collector.collect_metrics(performance_metrics)
    final = monitor.stop_monitoring()
    assert performance_metrics["rss_mb_peak"] > 0 and performance_metrics["cpu_time_s"] > 0
    assert collector.summary()["rss_mb_peak"]["count"] == 1 and final["wall_time_s"] > 0


# -- benchmark -----------------------------------------------------------------------------------------------
def test_benchmark_snippet_runs_and_says_why_cells_skip(tmp_path, monkeypatch):
    from echo_rl.evaluation.benchmark import BenchmarkConfig, EchoRLBenchmark

    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)  # the config's default output_dir is relative
    config = BenchmarkConfig(tasks=["alfworld", "webshop", "cruxeval"], backbones=["gpt-4o", "claude-3.5-sonnet"],
                             baselines=["react", "tot", "ppo-rlhf"], num_seeds=10)
    results = asyncio.run(EchoRLBenchmark(config).run_benchmark())

    assert results["cells"] == 3 * 3 * 2 * 10 and results["skipped"] == results["cells"]
    reasons = {pc.cell.method: pc.skip_reason for pc in EchoRLBenchmark(config).plan()}
    assert "API model 'claude-3.5-sonnet' has none" in reasons["ppo-rlhf"]
    assert (tmp_path / "runs/benchmark/config.yaml").is_file()


def test_ppo_rlhf_and_rlaif_cells_build_their_training_config():
    from echo_rl.evaluation.methods import get_method

    rlhf = get_method("ppo-rlhf").training_config("minigrid", "tiny", {"lm_config": {"max_turns": 3}})
    assert (rlhf.agent, rlhf.backbone, rlhf.lm_config.objective, rlhf.lm_config.reward) == \
        ("ppo", "tiny", "ppo-rlhf", "env")
    assert rlhf.lm_config.max_turns == 3  # the user's lm_config merges with the method's
    rlaif = get_method("rlaif").training_config("minigrid", "tiny:small", {})
    assert (rlaif.lm_config.reward, rlaif.lm_config.judge_backbone) == ("rlaif", "tiny:small")
    other = get_method("rlaif").training_config("minigrid", "tiny", {"lm_config": {"judge_backbone": "tiny:small"}})
    assert other.lm_config.judge_backbone == "tiny:small"


@pytest.mark.slow
def test_ppo_rlhf_and_rlaif_run_on_a_tiny_budget(tmp_path):
    import json

    from echo_rl.evaluation.benchmark import BenchmarkConfig, EchoRLBenchmark

    cfg = BenchmarkConfig(
        tasks=["minigrid"], backbones=["tiny"], baselines=["ppo-rlhf", "rlaif"], num_seeds=1, num_episodes=2,
        max_steps_per_episode=4, output_dir=str(tmp_path), generate_plots=False, generate_report=False,
        echo_rl_configs={"total_timesteps": 8, "num_actors": 4, "batch_size": 4, "evaluation_frequency": 0,
                         "save_frequency": 0, "lm_config": {"sft_episodes": 0, "sft_steps": 0, "heldout_pool": 0,
                                                            "max_updates": 1, "max_turns": 4, "max_new_tokens": 4}})
    summary = asyncio.run(EchoRLBenchmark(cfg).run_benchmark())
    assert summary["ok"] == 2, summary
    for rec in (json.loads(p.read_text()) for p in tmp_path.rglob("cells/**/*.json")):
        assert rec["metrics"]["num_episodes"] == 2
        assert rec["notes"]["evaluation_results"]["episodes"] == 2.0


# -- training config -----------------------------------------------------------------------------------------
def test_training_config_snippet(monkeypatch, tmp_path):
    import echo_rl.models.fetch as fetch
    from echo_rl import EchoRLTrainer, TrainingConfig

    monkeypatch.setattr(fetch, "is_fetched", lambda name: True)  # validation only: the default backbone "exists"
    config = TrainingConfig(env_name="alfworld", total_timesteps=1000000, learning_starts=10000, train_frequency=4,
                            evaluation_frequency=10000, save_frequency=50000, num_actors=128, num_learners=2,
                            batch_size=256, device="cpu")
    assert config.backbone == fetch.DEFAULT_TEXT_BACKBONE and config.num_learners == 2
    # accepted as a description, refused by the trainer (one line): data-parallel learners train vector tasks
    with pytest.raises(ConfigError, match="num_learners=2 is invalid .* on a text task") as exc:
        EchoRLTrainer(config, run_dir=tmp_path / "run")
    assert "\n" not in str(exc.value) and not (tmp_path / "run").exists()


# -- eta_bw sees every episode end (LM rollouts) ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_lm(tiny_path):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(tiny_path)
    return tok, transformers.AutoModelForCausalLM.from_pretrained(tiny_path).eval()


@pytest.mark.parametrize("cap", ["turns", "context"])
def test_lm_rollouts_close_eta_bw_episodes_on_caps(tiny_lm, cap):
    from echo_rl.config import ExecutionConfig
    from echo_rl.engine.engine import AsyncExecutionEngine
    from echo_rl.environments.minigrid import MiniGridEnvironment
    from echo_rl.lm.chat_delta import ChatRenderer
    from echo_rl.config import LMConfig
    from echo_rl.lm.rollout import LMRolloutWorker

    tok, model = tiny_lm

    async def run():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as engine:
            worker = LMRolloutWorker(engine, ChatRenderer(tok), LMConfig(max_turns=2, max_new_tokens=3))
            if cap == "context":  # after the first reply the context is "full": the episode ends there
                generate = engine.generate

                async def generate_then_fill(*a, **kw):
                    res = await generate(*a, **kw)
                    engine.max_context = 0
                    return res
                engine.generate = generate_then_fill
            trajs = []
            for s in range(3):
                trajs.append(await worker.episode(MiniGridEnvironment(task_type="empty", max_steps=50), seed=s))
                engine.max_context = engine.runner.max_context
            return trajs, worker.bandwidth.snapshot()  # the generator's η_bw tracker, fed from engine results

    trajs, snap = asyncio.run(run())
    assert all(t.info["truncated"] and t.num_turns == (2 if cap == "turns" else 1) for t in trajs)
    assert snap.episodes == 3 and math.isfinite(snap.eta_bw)


def test_engine_snippet_submit_rollout_with_state_sequence_and_priority(tiny_lm):
    """AsyncExecutionEngine(config=, model=, device=) and submit_rollout(state_sequence=, priority=) as documented."""
    from echo_rl.config import ExecutionConfig
    from echo_rl.core.async_execution import AsyncExecutionEngine

    tok, model = tiny_lm
    state_window = tok("You see a key and a door.")["input_ids"]

    async def run():
        async with AsyncExecutionEngine(config=ExecutionConfig(), model=model, device="cpu") as engine:
            documented = await engine.submit_rollout(state_sequence=state_window, priority=1.0, max_new_tokens=5)
            direct = await engine.generate(state_window, max_new_tokens=5, reward_estimate=1.0)
            with pytest.raises(TypeError, match="either"):
                await engine.submit_rollout("ep", [1], state_sequence=state_window)
            with pytest.raises(ValueError, match="reward_estimate"):
                await engine.submit_rollout(state_sequence=state_window, priority=float("nan"))
            return documented, direct

    documented, direct = asyncio.run(run())
    assert documented.token_ids == direct.token_ids  # greedy: the documented form is generate() on the window
    assert 1 <= len(documented.token_ids) <= 5
    assert documented.prompt_length == len(state_window)

"""Data-parallel learners (``num_learners=N``): N processes, each stepping its share of the envs.

Why this shape: an on-policy learner's update is a sum over the rollout, so it splits
exactly. Learner ``r`` owns envs ``[r*k, (r+1)*k)`` of the ``num_actors = N*k`` envs (seeded
as in the one-learner run) and so the columns of the ``[T, num_actors]`` rollout; every
learner draws the same permutation of the *global* batch, computes its minibatch loss only
on the indices it holds, scaled by its share of the minibatch, and the gradients are summed
over the learners (``torch.distributed``; gloo on CPU, NCCL on CUDA) before each optimiser
step. What must be global is all-reduced the same way: advantage normalisation (mean and
std over the minibatch), the metrics, and with them the ``target_kl`` early stop. Hence the
same seed and global batch give one learner's update within float tolerance.

The agent reads the learner through a narrow seam (:class:`DataParallel`:
``local_indices``, ``all_reduce_``, ``sum_gradients``); :func:`run_learners` spawns the
processes for the trainer; :func:`current` is this process's learner (None: one learner).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import socket
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import torch
import torch.distributed as dist

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.distributed.learner_rank import current, set_current  # noqa: F401 - current: importable here too

#: agents whose learner is data-parallel (the others refuse num_learners > 1)
DATA_PARALLEL_AGENTS = ("ppo",)

@dataclass
class DataParallel:
    """Learner ``rank`` of ``world_size``; ``config`` is the run's (global) configuration."""

    rank: int
    world_size: int
    config: TrainingConfig

    @property
    def envs_per_learner(self) -> int:
        return self.config.num_actors // self.world_size

    def env_slice(self) -> slice:
        k = self.envs_per_learner
        return slice(self.rank * k, (self.rank + 1) * k)

    def local_config(self) -> TrainingConfig:
        """The config one learner builds its agent and envs from: its ``k`` envs and ``1/N`` of each batch.

        ``total_timesteps`` keeps the global number of updates (LR annealing reads it).
        """
        cfg, n = self.config, self.world_size
        updates = math.ceil(cfg.total_timesteps / cfg.batch_size)
        local = dataclasses.replace(cfg, num_actors=self.envs_per_learner, batch_size=cfg.batch_size // n,
                                    total_timesteps=updates * (cfg.batch_size // n),
                                    learning_starts=cfg.learning_starts // n, num_learners=1)
        if cfg.train_frequency is not None:
            local = dataclasses.replace(local, train_frequency=cfg.train_frequency // n)
        return local

    def local_indices(self, idx: np.ndarray) -> np.ndarray:
        """Global flat indices ``t * num_actors + e`` of a ``[T, num_actors]`` batch -> this learner's flat
        indices ``t * k + (e - rank * k)`` of its ``[T, k]`` part (those it holds, in the given order)."""
        e_all, k = self.config.num_actors, self.envs_per_learner
        t, e = np.divmod(idx, e_all)
        mine = e // k == self.rank
        return t[mine] * k + e[mine] - self.rank * k

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the learners, in place (and return it)."""
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def any_(self, flag: bool) -> bool:
        """True on every learner when it is True on any (a stop all of them must agree on)."""
        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over the learners in one flat all-reduce (a learner with no
        sample in this minibatch contributes zeros)."""
        params = [p for p in parameters if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self.all_reduce_(torch.cat([g.reshape(-1) for g in grads]))
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone()
            offset += n


def check_config(config: TrainingConfig) -> None:
    """One-line ConfigError when ``config.num_learners > 1`` asks for what data-parallel learners do not do."""
    n = config.num_learners
    if n <= 1:
        return
    if config.text_task or config.agent not in DATA_PARALLEL_AGENTS:
        raise ConfigError(f"TrainingConfig.num_learners={n} is invalid for agent {config.agent!r}"
                          f"{' on a text task' if config.text_task else ''}: data-parallel learners train "
                          f"{', '.join(DATA_PARALLEL_AGENTS)} on vector tasks (set num_learners=1)")
    if config.intrinsic_reward:
        raise ConfigError(f"TrainingConfig.num_learners={n} is invalid with intrinsic_reward="
                          f"{config.intrinsic_reward!r}: the reward module would train apart on each learner "
                          f"(set num_learners=1)")
    if config.ppo_config.scale_rewards:
        raise ConfigError(f"TrainingConfig.num_learners={n} is invalid with ppo_config.scale_rewards=True: each "
                          f"learner would scale by its own envs' return statistics (set num_learners=1)")
    if config.backend != "local":
        raise ConfigError(f"TrainingConfig.num_learners={n} is invalid with backend={config.backend!r}: each "
                          f"learner steps its own envs (backend=local)")
    if config.num_actors % n:
        raise ConfigError(f"TrainingConfig.num_learners={n} is invalid: num_actors={config.num_actors} must be a "
                          f"multiple of it (each learner steps num_actors/num_learners envs)")


def free_port() -> int:
    """A TCP port free on loopback now (the rendezvous of the learners)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_learner(rank: int, world_size: int, config: TrainingConfig, port: int,
                 addr: str = "127.0.0.1") -> DataParallel:
    """Join the process group (gloo, or NCCL on CUDA) and make this process learner ``rank``."""
    os.environ.setdefault("MASTER_ADDR", addr)
    os.environ["MASTER_PORT"] = str(port)
    cuda = config.device.startswith("cuda")
    if cuda:
        config = dataclasses.replace(config, device=f"cuda:{rank % torch.cuda.device_count()}")
        torch.cuda.set_device(torch.device(config.device))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}",
                            rank=rank, world_size=world_size)
    learner = DataParallel(rank, world_size, config)
    set_current(learner)
    return learner


def shutdown_learner() -> None:
    set_current(None)
    if dist.is_initialized():
        dist.destroy_process_group()


def _learner_main(rank: int, world_size: int, port: int, fn: Callable, config: TrainingConfig, args: tuple,
                  results) -> None:
    try:
        init_learner(rank, world_size, config, port)
        out = fn(rank, *args)
        # plain pickle bytes: the queue's pickler would send tensors as shared memory this process frees on exit
        results.put((rank, "ok", pickle.dumps(out)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        import traceback

        results.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        shutdown_learner()


def run_learners(config: TrainingConfig, fn: Callable, *args: Any) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``config.num_learners`` spawned learner processes (each joined to the
    group, :func:`current` set); return their results by rank, or raise the first learner's error."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    n = config.num_learners
    procs = [ctx.Process(target=_learner_main, args=(r, n, port, fn, config, args, results), daemon=False)
             for r in range(n)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    errors: list[str] = []
    try:
        while len(out) + len(errors) < n:
            try:
                rank, status, value = results.get(timeout=5)
            except Exception:  # queue.Empty: a learner may have died without reporting
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    errors.append(f"learner process {procs.index(dead[0])} exited with code {dead[0].exitcode}")
                    break
                continue
            if status == "ok":
                out[rank] = pickle.loads(value)
            else:
                errors.append(f"learner {rank}: {value}")
                break
    finally:
        for p in procs:
            p.join(timeout=None if not errors else 10)
            if p.is_alive():
                p.terminate()
                p.join()
    if errors:
        raise RuntimeError(errors[0])
    return [out[r] for r in range(n)]

"""Run the user's program, N episodes at a time, against the loopback server, and collect its trajectories.

Each episode is one run of the command with its own rollout: ``OPENAI_BASE_URL`` (its rollout path),
``OPENAI_API_KEY``, ``ECHO_RL_ROLLOUT_ID``, ``ECHO_RL_REWARD_URL`` and ``ECHO_RL_EPISODE`` (a number
the program may seed its task with). What goes wrong with one episode is counted and the batch goes on:

- ``crashed``: the program exited non-zero (its last stderr line is kept in ``last_error``);
- ``timed_out``: it ran past ``episode_timeout`` seconds (its process group is killed);
- ``no_reward``: it ended without reporting a reward; ``no_turns``: it never asked the policy;
- ``stale``: its policy version is more than ``max_policy_lag`` behind the learner (the Ray generator's rule,
  :func:`echo_rl.lm.ray_lm.within_lag`).

Episodes are grouped by the task the program names with its reward: one ``group_id`` per task in a batch,
so GRPO / GiGPO / ECHO compare episodes of one task.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import tempfile
from dataclasses import dataclass, field
from typing import Any, Sequence

from echo_rl.external.recorder import Recorder
from echo_rl.external.server import trainer_app
from echo_rl.lm.ray_lm import within_lag
from echo_rl.serve.server import ModelServer
from echo_rl.types import TokenTrajectory

DROPS = ("crashed", "timed_out", "no_reward", "no_turns", "stale")


@dataclass
class ExternalBatch:
    trajectories: list[TokenTrajectory]
    counts: dict[str, int] = field(default_factory=dict)
    last_error: str = ""

    @property
    def steps(self) -> int:
        return sum(t.num_turns for t in self.trajectories)

    def metrics(self) -> dict[str, float]:
        return {f"external/{k}": float(v) for k, v in sorted(self.counts.items())}


class ExternalRunner:
    """Serves ``backbone`` on loopback and runs ``command`` per episode; use as a context manager."""

    def __init__(self, backbone: Any, command: Sequence[str], *, concurrency: int = 4, episode_timeout: float = 300.0,
                 max_policy_lag: int = 0, env: dict[str, str] | None = None) -> None:
        if not command:
            raise ValueError("command is empty: give the program to run, e.g. ['python', 'agent.py']")
        if concurrency < 1 or episode_timeout <= 0 or max_policy_lag < 0:
            raise ValueError(f"concurrency={concurrency} (>= 1), episode_timeout={episode_timeout} (> 0) and "
                             f"max_policy_lag={max_policy_lag} (>= 0) are out of range")
        self.command, self.concurrency, self.timeout = list(command), concurrency, episode_timeout
        self.max_lag, self.env = max_policy_lag, dict(env or {})
        self.key = secrets.token_urlsafe(24)
        self.recorder = Recorder(backbone.tokenizer)
        self.server = ModelServer(trainer_app(backbone, self.recorder, self.key, max_concurrent=max(concurrency, 1)))
        self.next_episode = 0

    def __enter__(self) -> "ExternalRunner":
        self.server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.stop()

    @property
    def root(self) -> str:
        return f"http://{self.server.host}:{self.server.port}"

    def sync(self, state_dict: dict | None, version: int) -> None:
        """Load the learner's weights as ``version`` (between batches: in-flight episodes keep their tokens'
        versions, and their episode is judged by the staleness rule)."""
        self.server.app.state.engine_host.update_weights(state_dict, version)
        self.recorder.version = version

    async def batch(self, episodes: int) -> ExternalBatch:
        """Run ``episodes`` episodes, ``concurrency`` at a time; failures are counted, never raised."""
        counts = {k: 0 for k in DROPS}
        out: list[tuple[str, list[TokenTrajectory]]] = []
        slots = asyncio.Semaphore(self.concurrency)
        errors: list[str] = []

        async def one(index: int) -> None:
            async with slots:
                rid = secrets.token_hex(12)
                self.recorder.start(rid)
                status = await self._run(rid, index, errors)
                ep, trajs = self.recorder.finish(rid)
                if status:
                    counts[status] += 1
                elif ep.reward is None:
                    counts["no_reward"] += 1
                elif not trajs:
                    counts["no_turns"] += 1
                elif not within_lag(self.recorder.version, ep.policy_version, self.max_lag):
                    counts["stale"] += 1
                else:
                    out.append((ep.task, trajs))

        before = dict(self.recorder.counts)
        first = self.next_episode
        self.next_episode += episodes
        await asyncio.gather(*(one(first + i) for i in range(episodes)))
        groups: dict[str, int] = {}
        trajs = []
        for task, ts in out:
            gid = groups.setdefault(task, len(groups))
            for t in ts:
                t.group_id, t.episode_id = gid, len(trajs)
                trajs.append(t)
        trajs.sort(key=lambda t: t.group_id)
        counts.update({k: v - before.get(k, 0) for k, v in self.recorder.counts.items()})
        counts["episodes"] = len(out)
        return ExternalBatch(trajs, counts, errors[-1] if errors else "")

    async def _run(self, rid: str, index: int, errors: list[str]) -> str | None:
        base = f"{self.root}/rollout/{rid}/v1"
        env = {**os.environ, **self.env, "OPENAI_BASE_URL": base, "OPENAI_API_KEY": self.key,
               "ECHO_RL_ROLLOUT_ID": rid, "ECHO_RL_REWARD_URL": f"{base}/echo_rl/reward",
               "ECHO_RL_EPISODE": str(index), "ECHO_RL_MODEL": "policy"}
        err = tempfile.TemporaryFile()  # a file, not a pipe: a chatty program cannot fill memory or block
        try:
            proc = await asyncio.create_subprocess_exec(*self.command, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.DEVNULL, stderr=err,
                                                        start_new_session=True)
        except OSError as exc:
            err.close()
            errors.append(f"cannot run {self.command[0]!r}: {exc.strerror}")
            return "crashed"
        with err:
            return await self._wait(proc, err, index, errors)

    async def _wait(self, proc: Any, err: Any, index: int, errors: list[str]) -> str | None:
        try:
            await asyncio.wait_for(proc.wait(), self.timeout)
        except asyncio.TimeoutError:
            _kill(proc)
            await proc.wait()
            errors.append(f"episode {index} ran past episode_timeout={self.timeout:g}s and was killed")
            return "timed_out"
        except BaseException:
            _kill(proc)
            raise
        if proc.returncode != 0:
            err.seek(max(0, err.seek(0, 2) - 4096))
            lines = [ln for ln in err.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            errors.append(f"episode {index} exited with {proc.returncode}: {lines[-1][:300] if lines else ''}")
            return "crashed"
        return None


def _kill(proc: Any) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the program's own children too (its session is its own)
    except (ProcessLookupError, PermissionError):
        pass

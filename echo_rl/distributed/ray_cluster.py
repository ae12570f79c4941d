"""Joining or starting the Ray cluster the Ray backends run on (loopback-only when local)."""

from __future__ import annotations

import logging
import os

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.utils.optional import require

log = logging.getLogger("echo_rl.ray_backend")

LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
ENVS_PER_WORKER = 8  # workers when ray_num_workers is None: num_actors // 8 (at least 1)


def default_num_workers(config: TrainingConfig) -> int:
    """Ray workers of a run: ``ray_num_workers``, else one per 8 actors (the vector and LM backends share it)."""
    return config.ray_num_workers or max(1, config.num_actors // ENVS_PER_WORKER)


def _ray():
    return require("ray", "distributed")


def _init_ray(config: TrainingConfig, num_workers: int) -> bool:
    """Connect to ``config.ray_address``, reuse a running Ray, or start one bound to loopback.

    Returns True when this call started Ray (the agent then shuts it down on close).
    """
    if config.ray_address is None and not _loaded_ray_is_initialized():
        if num_workers > (os.cpu_count() or 1):
            log.warning("%d Ray rollout workers on %d CPUs: they will share cores (fewer num_actors, or a "
                        "cluster via ray_address, gives each its own)", num_workers, os.cpu_count() or 1)
        start_local_ray(num_workers)
        return True
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=config.ray_address, logging_level=logging.WARNING, log_to_driver=False)
    _check_cpus(ray, num_workers)
    return False


def _loaded_ray_is_initialized() -> bool:
    import sys

    return "ray" in sys.modules and sys.modules["ray"] is not None and sys.modules["ray"].is_initialized()


def start_local_ray(num_cpus: int, object_store_memory: int = LOCAL_OBJECT_STORE_BYTES):
    """A single-node Ray whose servers listen on 127.0.0.1 only, without dashboard or usage reporting.

    Ray binds its servers to the node IP; on Linux that is the routable address unless
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which makes it loopback (read by Ray at import,
    and by the daemons it spawns, so it is set in the environment and in the loaded module).
    """
    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED")}
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray = _ray()
    from ray._private import ray_constants

    cluster = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 object_store_memory=object_store_memory, logging_level=logging.WARNING, log_to_driver=False)
    finally:  # the daemons have inherited it; later connections to real clusters must not
        ray_constants.ENABLE_RAY_CLUSTER = cluster
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return ray


def _check_cpus(ray, num_workers: int) -> None:
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < num_workers:
        raise ConfigError(f"the Ray cluster has {cpus:g} CPUs; backend=ray needs one per rollout worker "
                          f"({num_workers} workers for num_actors): add CPUs or lower num_actors")

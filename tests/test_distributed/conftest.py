import pytest
from dist_helpers import RecordingBuffer, example


@pytest.fixture
def buffer():
    return RecordingBuffer(1 << 16, example=example(), min_experiences=1, seed=0)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 CPUs, loopback) per test module; agents reuse it and leave it running."""
    import torch

    from echo_rl.distributed.ray_cluster import start_local_ray

    torch.set_num_threads(1)
    ray = start_local_ray(num_cpus=2)
    try:
        yield ray
    finally:
        ray.shutdown()

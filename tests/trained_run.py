"""A small vector run trained once per test module, and a fresh copy of its run directory for each test."""

import asyncio
import shutil

import pytest

from echo_rl import EchoRLTrainer, TrainingConfig


def trained_run_fixtures(config: dict, *, symlinks: bool = False):
    """``(trained, run)`` fixtures for a module: ``trained`` is the run directory of ``TrainingConfig(**config)``,
    trained once; ``run`` a copy a test may damage (``symlinks``: links are copied as links)."""

    @pytest.fixture(scope="module")
    def trained(tmp_path_factory):
        run = tmp_path_factory.mktemp("trained") / "run"
        asyncio.run(EchoRLTrainer(TrainingConfig(**config), run_dir=run, show_progress=False).train())
        return run

    @pytest.fixture
    def run(trained, tmp_path):
        dst = tmp_path / "run"
        shutil.copytree(trained, dst, symlinks=symlinks)
        return dst

    return trained, run

"""EchoRL trains on an OpenEnv server: the LM trainer's episodes run on the word game over its /ws sessions."""

import asyncio

import pytest

pytest.importorskip("transformers")

from tests.openenv_helpers import COUNTS, serving, word_game_app  # noqa: E402

from test_loop import _cfg, _rows, save_checkpoint  # noqa: E402

from echo_rl.training.trainer import EchoRLTrainer  # noqa: E402


def test_trains_on_an_openenv_server(tmp_path, chatml_tokenizer):
    ckpt = save_checkpoint(tmp_path / "ckpt", chatml_tokenizer)
    before = dict(COUNTS)
    with serving(word_game_app(sessions=4)) as url:  # the trainer runs its 2 actors' episodes at once
        cfg = _cfg(ckpt, env_name="openenv", env_config={"url": url, "max_steps": 2, "observation_field": "prompt"},
                   total_timesteps=100, **{"lm_config.max_updates": 1, "lm_config.sft_episodes": 0,
                                           "lm_config.heldout_pool": 0})
        result = asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    assert result.num_updates == 1 and result.total_timesteps == 4  # 2 episodes x 2 turns, played on the server
    train = _rows(tmp_path / "run")[1]
    assert train["lm/env_ce"] > 0  # the game's replies were env_output tokens the world-model loss trained on
    # the server ran the training episodes and the evaluation's (one session each)
    assert COUNTS["reset"] - before["reset"] >= 2 + cfg.evaluation_episodes
    assert COUNTS["step"] - before["step"] >= 4

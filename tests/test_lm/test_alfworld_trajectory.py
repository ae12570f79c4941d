"""An ALFWorld expert episode as a token trajectory: roles from the env's segments, bodies decode back."""

import pytest

pytest.importorskip("textworld", reason="ALFWorld needs pip install 'echo-rl[alfworld]'")
pytest.importorskip("alfworld", reason="ALFWorld needs pip install 'echo-rl[alfworld]'")

from echo_rl.lm.chat_delta import ChatRenderer  # noqa: E402
from echo_rl.lm.sft import expert_trajectory  # noqa: E402
from echo_rl.types import ENV_OUTPUT, WARNING  # noqa: E402


@pytest.mark.slow
def test_alfworld_expert_episode_roles(shared_data, tmp_path, chatml_tokenizer):
    from echo_rl.environments.alfworld import ALFWorldConfig, ALFWorldEnvironment

    env = ALFWorldEnvironment(ALFWorldConfig(task_type="pick_and_place", max_objects=10, cache_dir=str(tmp_path)))
    r = ChatRenderer(chatml_tokenizer)
    traj = expert_trajectory(env, r, seed=0, max_turns=40)
    assert traj.info["won"] and traj.num_turns >= 2
    spans = traj.turn_spans()
    assert [chatml_tokenizer.decode(traj.token_ids[a:b - 1]) for a, b in spans] == traj.info["actions"]
    body = [t for t, x in zip(traj.token_ids[traj.prompt_length:], traj.roles[traj.prompt_length:])
            if x in (ENV_OUTPUT, WARNING)]
    assert len(body) == traj.env_output_count > 0
    assert "you see" in chatml_tokenizer.decode(body)  # the answers to the expert's look / go to actions

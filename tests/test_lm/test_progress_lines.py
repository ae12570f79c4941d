"""A language-model run says what it is doing as it goes - setup, SFT steps with their loss, evaluation
episodes k/n, each update - on the terminal stream and, the same lines time-stamped, in its progress.log."""

import asyncio
import re

import pytest

pytest.importorskip("transformers")

from echo_rl.training.trainer import EchoRLTrainer  # noqa: E402
from test_loop import _cfg, checkpoint  # noqa: E402,F401  (the fixture)

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "


def _run(checkpoint, run, show_progress):
    cfg = _cfg(checkpoint, total_timesteps=100, evaluation_episodes=2,
               **{"lm_config.max_updates": 2, "lm_config.sft_steps": 3, "lm_config.sft_episodes": 2})
    asyncio.run(EchoRLTrainer(cfg, run, show_progress=show_progress).train())


def test_a_tiny_lm_run_reports_every_stage_on_the_terminal_and_in_its_log(checkpoint, tmp_path, capsys):
    run = tmp_path / "run"
    _run(checkpoint, run, show_progress=True)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    logged = (run / "progress.log").read_text().splitlines()
    assert all(re.match(STAMP, line) for line in logged)
    assert [line[20:] for line in logged] == said  # the same lines, time-stamped

    expected = [  # in this order, each line matched from the start
        r"\[setup\] echo-rl agent on minigrid:MiniGrid-Empty-Random-5x5-v0, model .*ckpt, built in 0:\d\d$",
        r"\[sft\] 0/3 steps \(warm start on 2 expert episodes, 2 a step\)$",
        r"\[sft\] 1/3 steps \| loss \d+\.\d{3} \| 0:\d\d elapsed \| ~0:\d\d left$",
        r"\[sft\] 3/3 steps \| loss \d+\.\d{3} \| 0:\d\d elapsed$",
        r"\[eval\] step 0: 0/2 episodes \(2 at a time\)$",
        r"\[eval\] step 0: 1/2 episodes \| 0:\d\d elapsed \| ~0:\d\d left$",
        r"\[eval\] step 0: 2/2 episodes \| 0:\d\d elapsed$",
        r"\[eval\] step 0: success \d\.\d\d \(2 episodes\)",
        r"\[train\] update 1/2 \| 4/100 steps \| return .* \| success .* \| loss -?\d+\.\d{3}$",
        r"\[eval\] step 4: 0/2 episodes",
        r"\[eval\] step 4: success",
        r"\[train\] update 2/2 \| 8/100 steps \| .* \| loss -?\d+\.\d{3}$",
        r"\[eval\] step 8: 2/2 episodes",
        r"\[eval\] step 8: success",
    ]
    at = 0
    for pattern in expected:
        found = next((i for i in range(at, len(said)) if re.match(pattern, said[i])), None)
        assert found is not None, f"no line after {said[at - 1] if at else 'the start'!r} matches {pattern!r}"
        at = found + 1


def test_no_progress_keeps_the_terminal_quiet_but_still_logs(checkpoint, tmp_path, capsys):
    run = tmp_path / "run"
    _run(checkpoint, run, show_progress=False)
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    log = (run / "progress.log").read_text()
    assert "[sft] 3/3 steps | loss" in log and "[train] update 2/2 |" in log and "[eval] step 8: 2/2 episodes" in log

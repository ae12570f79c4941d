"""A trained LM run exports as a plain transformers directory that transformers loads and `echo-rl serve` serves."""

import asyncio

import pytest
import torch

transformers = pytest.importorskip("transformers")

from echo_rl.cli import main  # noqa: E402
from echo_rl.config import TrainingConfig  # noqa: E402

MSGS = [{"role": "system", "content": "You are in a grid."}, {"role": "user", "content": "You see a goal."}]


@pytest.fixture(scope="module")
def lm_run(tiny_path, tmp_path_factory):
    """A short real LM run on the tiny preset (1 SFT step, 2 GRPO updates) on MiniGrid as text."""
    from echo_rl.training.trainer import EchoRLTrainer

    cfg = TrainingConfig().with_overrides({
        "env_name": "minigrid:MiniGrid-Empty-Random-5x5-v0", "env_config": {"max_steps": 2}, "backbone": "tiny",
        "agent": "ppo", "num_actors": 2, "batch_size": 2, "total_timesteps": 8, "evaluation_episodes": 1,
        "evaluation_frequency": 0, "save_frequency": 0, "lm_config.group_size": 2, "lm_config.max_new_tokens": 4,
        "lm_config.sft_episodes": 1, "lm_config.sft_steps": 1, "lm_config.heldout_pool": 1})
    run = tmp_path_factory.mktemp("lm") / "run"
    threads = torch.get_num_threads()
    try:
        asyncio.run(EchoRLTrainer(cfg, run_dir=run, show_progress=False).train())
    finally:
        torch.set_num_threads(threads)
    return run


@pytest.fixture(scope="module")
def exported(lm_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm_export") / "model"
    assert main(["export", "--run-dir", str(lm_run), "--out", str(out)]) == 0
    return out


def test_export_is_the_runs_weights_in_a_transformers_directory(lm_run, exported, tiny_path):
    from echo_rl.training.run_dir import RunDirectory

    ckpt = RunDirectory(lm_run, RunDirectory.config_of(lm_run)).latest_checkpoint()
    trained = torch.load(ckpt / "state.pt", weights_only=True)["state"]["model"]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(exported), local_files_only=True)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_path), local_files_only=True)
    got = model.state_dict()
    assert set(got) >= set(k for k in trained if not k.endswith("rotary_emb.inv_freq"))
    for name, tensor in trained.items():
        if name in got:
            torch.testing.assert_close(got[name].float(), tensor.float(), rtol=0, atol=0)
    assert any(not torch.equal(base.state_dict()[k], trained[k]) for k in trained if k in base.state_dict())
    tok = transformers.AutoTokenizer.from_pretrained(str(exported), local_files_only=True)
    assert tok.chat_template and (exported / "echo_rl_export.json").is_file()


def test_a_trained_run_is_served_by_echo_rl_serve_to_the_openai_client(lm_run, exported, tmp_path):
    """`echo-rl serve --run-dir RUN` (the real command, in its own process) exports the run's newest checkpoint and
    answers the official client with what the exported checkpoint generates locally."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    import socket
    import subprocess
    import sys
    import time

    from echo_rl.models import load_backbone

    local = load_backbone(str(exported), device="cpu").chat(MSGS, max_tokens=6, temperature=0)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "echo_rl.cli", "serve", "--run-dir", str(lm_run), "--port", str(port),
           "--model-name", "exported", "--device", "cpu", "--torch-threads", "1", "--log-level", "warning"]
    with log.open("w") as err:  # the server process keeps its own descriptor
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0, timeout=60)
        deadline = time.monotonic() + 120
        while True:
            try:
                assert [m.id for m in client.models.list().data] == ["exported"]
                break
            except openai.APIConnectionError:
                assert server.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, "echo-rl serve did not come up in 120 s"
                time.sleep(0.5)
        resp = client.chat.completions.create(model="exported", messages=MSGS, max_tokens=6, temperature=0)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert resp.choices[0].message.content == local.text
    assert resp.usage.completion_tokens == local.usage.completion_tokens
    assert (lm_run / "export" / "transformers" / "echo_rl_export.json").is_file()


def test_serve_run_dir_bad_input_is_one_line(tmp_path, capsys):
    assert main(["serve", "--run-dir", str(tmp_path / "nope")]) == 2
    assert main(["serve", "--run-dir", str(tmp_path)]) == 2  # not a run directory
    errs = capsys.readouterr().err.strip().splitlines()
    assert len(errs) == 2 and "does not exist" in errs[0] and str(tmp_path) in errs[1]


def test_lm_export_refuses_vector_formats(lm_run, capsys):
    assert main(["export", "--run-dir", str(lm_run), "--format", "onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "allowed: transformers" in err

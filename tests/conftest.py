import pytest

from echo_rl.utils.paths import data_root


@pytest.fixture
def one_thread():
    """Tiny networks: torch's thread pool only contends with the envs on a small box (opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_data():
    """The benchmark data folder (../shared/data); tests needing it skip when it is absent."""
    root = data_root()
    if not root.is_dir():
        pytest.skip(f"benchmark data not found at {root} (set ECHO_RL_DATA_DIR)")
    return root


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    """The tiny preset's checkpoint, built once per test session in a temporary cache."""
    import os

    from echo_rl.models.tiny import tiny_checkpoint

    cache = tmp_path_factory.getbasetemp() / "echo_rl_cache"
    old = os.environ.get("ECHO_RL_CACHE_DIR")
    os.environ["ECHO_RL_CACHE_DIR"] = str(cache)
    try:
        yield tiny_checkpoint("tiny")
    finally:
        if old is None:
            os.environ.pop("ECHO_RL_CACHE_DIR", None)
        else:
            os.environ["ECHO_RL_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def tiny(tiny_path):
    from echo_rl.models.local import LocalBackbone

    return LocalBackbone(tiny_path, device="cpu", name="tiny")


@pytest.fixture(scope="session", autouse=True)
def _run_key_home(tmp_path_factory):
    """Keep the run-signing key (state_codec) of test runs out of the user's ~/.config; CLI children inherit it."""
    import os

    old = os.environ.get("ECHO_RL_HOME")
    os.environ["ECHO_RL_HOME"] = str(tmp_path_factory.mktemp("echo_rl_home"))
    yield
    if old is None:
        os.environ.pop("ECHO_RL_HOME", None)
    else:
        os.environ["ECHO_RL_HOME"] = old


@pytest.fixture(scope="session")
def sandbox_ok():
    """Skip unless the terminal tasks' bubblewrap shell runs here (bwrap installed, user namespaces allowed)."""
    import os
    import tempfile

    from echo_rl.environments.sandbox import SandboxUnavailable
    from echo_rl.environments.terminal.shell import ShellSession

    d = tempfile.mkdtemp()
    try:
        with ShellSession(d, uid=None) as s:
            if os.geteuid() == 0:
                os.chown(d, s.uid, s.uid)
            if s.run("echo ok").output != "ok\n":
                pytest.skip("the bubblewrap shell does not run here")
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    finally:
        os.rmdir(d) if not os.listdir(d) else None

"""A checkpoint directory that cannot be served is refused at load time, in one line (exit 2 from the CLI)."""

import shutil

import pytest

pytest.importorskip("transformers")

from echo_rl.cli import main  # noqa: E402
from echo_rl.config import ConfigError  # noqa: E402
from echo_rl.models.local import LocalBackbone  # noqa: E402


def _no_tokenizer(d):
    for f in d.glob("tokenizer*"):
        f.unlink()


def _corrupt(d):
    (d / "model.safetensors").write_bytes(b"\x00\xff" * 500)


def _truncated(d):
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[:5000])


def _no_weights(d):
    (d / "model.safetensors").unlink()


def _empty_vocab(d):  # a tokenizer.json that loads but knows no tokens
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordLevel", "vocab": {}, '
                                      '"unk_token": null}, "added_tokens": []}')


BROKEN = {"no_tokenizer": (_no_tokenizer, "has no tokenizer"),
          "corrupt_weights": (_corrupt, "cannot load its weights"),
          "truncated_weights": (_truncated, "cannot load its weights"),
          "no_weights": (_no_weights, "has no weights"),
          "empty_vocab": (_empty_vocab, "tokenizer")}


@pytest.fixture
def copy(tiny_path, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(tiny_path, d)
    return d


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_checkpoint_is_one_line_config_error(copy, case):
    breaker, words = BROKEN[case]
    breaker(copy)
    with pytest.raises(ConfigError, match=words) as info:
        LocalBackbone(copy, device="cpu")
    assert "\n" not in str(info.value) and str(copy) in str(info.value)


def test_missing_path_and_file_are_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        LocalBackbone(tmp_path / "nope", device="cpu")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        LocalBackbone(tmp_path / "f", device="cpu")


@pytest.mark.parametrize("case", ["missing", "no_tokenizer", "corrupt_weights"])
def test_serve_refuses_a_broken_directory_with_exit_2(copy, case, capsys):
    """Before: a missing path said "unknown backbone", a corrupt file gave a traceback, no tokenizer started."""
    target = copy.parent / "missing" if case == "missing" else copy
    if case != "missing":
        BROKEN[case][0](copy)
    assert main(["serve", "--backbone", str(target), "--port", "0", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(target) in err
    assert {"missing": "does not exist", "no_tokenizer": "no tokenizer",
            "corrupt_weights": "cannot load its weights"}[case] in err
    assert "unknown backbone" not in err


def test_intact_copy_still_loads(copy):
    b = LocalBackbone(copy, device="cpu")
    assert b.encode("go to cabinet 1")

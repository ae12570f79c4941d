"""The run directory: config.yaml, metrics.jsonl, progress.log, checkpoints, plots, summary.json.

Checkpoints are written to a temporary folder and renamed into place, and the
``latest`` pointer is replaced atomically, so a run killed at any instant
leaves a loadable checkpoint behind. A run directory holds no pickles (rollout
state: ``state_codec``; weights: ``torch.load(weights_only=True)``), so opening
one never runs code from it; a damaged newest checkpoint falls back to an older
one kept. Every file of a run is read and written through its
:class:`~echo_rl.utils.jail.Jail`: paths stay inside the directory, symlinks
are not followed, and reads are of regular files within a size cap.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.utils import state_codec
from echo_rl.utils.jail import Jail, JailError, parts_of


class CheckpointError(ConfigError):
    """A checkpoint that cannot be loaded (damaged, refused, or from an older format)."""


class CheckpointRefused(CheckpointError):
    """A checkpoint holding pickled data not signed with this user's run key. Resuming stops here instead of
    falling back to an older checkpoint, so the refused one is never overwritten (copy the key, or start anew)."""


def _reason(exc: BaseException) -> str:
    """An exception as a short single line (torch's unpickling errors span many lines)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def _write_failure(exc: RuntimeError, where: Path) -> str:
    """One line for a failed torch.save: its first line, and the free space, which is the usual cause."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    try:
        free = shutil.disk_usage(where).free / 2**20
    except OSError:
        return f"the write failed ({first})"
    return f"the write failed ({first}; {free:,.0f} MiB free on that device)"


def _os_reason(exc: OSError) -> str:
    return exc.strerror or _reason(exc)


def default_run_dir(config: TrainingConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    task = config.env_name.replace(":", "-").replace("/", "-")
    return Path(config.results_dir) / f"{task}-{config.agent}-seed{config.seed}-{stamp}"


class RunDirectory:
    def __init__(self, path: str | os.PathLike, config: TrainingConfig):
        self.path = Path(path)
        self.config = config
        self.jail = Jail(self.path)

    @property
    def checkpoint_rel(self) -> tuple[str, ...]:
        """``config.checkpoint_dir`` as components inside the run directory (JailError when it leaves it)."""
        return parts_of(self.config.checkpoint_dir, "TrainingConfig.checkpoint_dir")

    @property
    def checkpoint_dir(self) -> Path:
        return self.path.joinpath(*self.checkpoint_rel)

    @property
    def tensorboard_dir(self) -> Path:
        """The TensorBoard folder, checked to be a real directory inside the run (TensorBoard writes by path)."""
        return self.jail.path(Path(*parts_of(self.config.tensorboard_dir, "TrainingConfig.tensorboard_dir")))

    def _ckpt(self, *names: str) -> Path:
        """A path relative to the run directory, below the checkpoint folder (for the jail)."""
        return Path(*self.checkpoint_rel, *names)

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def timings_path(self) -> Path:
        return self.path / "timings.jsonl"

    @property
    def progress_log_path(self) -> Path:
        """The run's progress lines as the terminal showed them, time-stamped (appended on resume)."""
        return self.path / "progress.log"

    def create(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"run directory {self.path} is a file; give a directory (--run-dir)")
        try:
            self.jail.path(self._ckpt(), create=True)
            self.config.save_yaml(self.path / "config.yaml")  # a rename: replaces a symlink, never its target
        except OSError as exc:
            raise ConfigError(f"cannot write the run directory {self.path}: {_os_reason(exc)}") from None

    # -- checkpoints ----------------------------------------------------------
    def save_checkpoint(self, step: int, state: dict[str, Any], rollout_state: Any) -> Path:
        """state -> state.pt (weights_only-loadable), rollout_state -> rollout.json + rollout.npz (no pickle:
        ``state_codec``), so opening a run directory never runs code from it."""
        final = self.checkpoint_dir / f"step_{step:012d}"
        tmp = None
        try:
            tmp = Path(tempfile.mkdtemp(dir=self.jail.path(self._ckpt(), create=True), prefix=".tmp-"))
            torch.save({"state": state, "config": self.config.to_dict(), "step": step}, tmp / "state.pt")
            state_codec.write(tmp, rollout_state)
            self.jail.remove_tree(self._ckpt(final.name))
            os.replace(tmp, final)
            self.jail.write_atomic(self._ckpt("latest"), final.name + "\n")
        except JailError:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        except (OSError, RuntimeError) as exc:  # torch.save's zip writer reports a full disk as a RuntimeError
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            reason = _os_reason(exc) if isinstance(exc, OSError) else _write_failure(exc, self.checkpoint_dir)
            kept = self.latest_checkpoint()
            raise ConfigError(f"cannot write a checkpoint in {self.checkpoint_dir}: {reason}; "
                              + (f"{kept.name} is kept" if kept else "no earlier checkpoint")) from None
        for old in self.jail.entries(self._ckpt(), "step_")[: -self.config.keep_checkpoints]:
            try:
                self.jail.remove_tree(self._ckpt(old))
            except OSError:
                pass
        return final

    def checkpoints(self) -> list[Path]:
        """Kept checkpoints, newest first: the ``latest`` pointer's target, then the others by step. A checkpoint
        folder, its ``state.pt`` or ``latest`` that is a symlink or not a regular file is a JailError."""
        try:
            names = self.jail.entries(self._ckpt(), "step_")
        except (FileNotFoundError, NotADirectoryError):  # no checkpoints yet, or the run directory is a file
            return []
        found = [self.checkpoint_dir / n for n in reversed(names) if self.jail.is_file(self._ckpt(n, "state.pt"))]
        try:
            name = self.jail.read_text(self._ckpt("latest"), "pointer").strip()
        except (FileNotFoundError, UnicodeDecodeError):
            name = None
        first = [p for p in found if p.name == name]
        return first + [p for p in found if p.name != name]

    def latest_checkpoint(self) -> Path | None:
        found = self.checkpoints()
        return found[0] if found else None

    @staticmethod
    def load_checkpoint(path: Path, rollout: bool = True) -> tuple[dict, Any]:
        """(state.pt payload, rollout state or None); CheckpointError (one line) when either is unreadable.
        ``rollout=False`` (evaluation) never opens the rollout files."""
        try:
            with Jail(path).open_read("state.pt", "checkpoint") as fh:
                payload = torch.load(fh, map_location="cpu", weights_only=True)
        except JailError as exc:
            raise CheckpointError(f"{path.name}/state.pt refused: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - any damage to the file: torch raises many kinds
            raise CheckpointError(f"{path.name}/state.pt is unreadable ({_reason(exc)})") from None
        if type(payload) is not dict or type(payload.get("state")) is not dict or type(payload.get("step")) is not int:
            raise CheckpointError(f"{path.name}/state.pt is not an echo-rl checkpoint (no state and step)")
        if not rollout:
            return payload, None
        if not os.path.lexists(path / state_codec.JSON_NAME):
            if os.path.lexists(path / "rollout.pkl"):
                raise CheckpointError(f"{path.name} was written by an older echo-rl: its rollout.pkl is a pickle, "
                                      f"which is never loaded (it could run code); `echo-rl eval` still reads its "
                                      f"weights, resuming needs a checkpoint from this version")
            raise CheckpointError(f"{path.name} has no {state_codec.JSON_NAME} (its envs mid-episode)")
        try:
            return payload, state_codec.read(path)
        except (state_codec.UntrustedState, JailError) as exc:  # tampered: refused, never an older fallback
            raise CheckpointRefused(f"{path.name}: rollout state refused: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - damaged data, whatever the parser raised
            raise CheckpointError(f"{path.name}: rollout state is unreadable ({_reason(exc)})") from None

    def load_newest(self, apply: Callable[[dict, Any], None], rollout: bool = True) -> Path:
        """Load the newest checkpoint that loads: ``apply(payload, rollout_state)`` for it; an unreadable newer
        one is skipped with one line on stderr. ConfigError (one line, each reason) when none loads."""
        found = self.checkpoints()
        if not found:
            raise ConfigError(f"no checkpoint in {self.checkpoint_dir}")
        failures = []
        for path in found:
            try:
                apply(*self.load_checkpoint(path, rollout=rollout))
            except CheckpointRefused:
                raise
            except state_codec.UntrustedState as exc:  # an env or Ray worker state refused while it was applied
                raise CheckpointRefused(f"{path.name}: rollout state refused: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - a checkpoint that does not fit the agent is unreadable too
                failures.append(str(exc) if isinstance(exc, ConfigError) else f"{path.name}: {_reason(exc)}")
                continue
            if failures:
                print(f"echo-rl: skipped {len(failures)} newer checkpoint(s) ({'; '.join(failures)}); "
                      f"loaded {path.name}", file=sys.stderr)
            return path
        raise ConfigError(f"no checkpoint in {self.checkpoint_dir} loads: {'; '.join(failures)}")

    @staticmethod
    def config_of(run_dir: str | os.PathLike, flag: str = "--resume") -> TrainingConfig:
        """The saved config of a run directory; ``flag`` names the option in the error."""
        root = Path(run_dir)
        path = root / "config.yaml"
        try:
            if not root.exists():
                raise ConfigError(f"{flag} {run_dir}: no such run directory")
            if not root.is_dir():
                raise ConfigError(f"{flag} {run_dir} is a file, not a run directory")
            if not os.path.lexists(path):
                raise ConfigError(f"{flag} {run_dir} is not a run directory: it has no config.yaml")
            text = Jail(root).read_text("config.yaml", "config")
            return TrainingConfig.from_saved_yaml_text(text, f"config file {path}")
        except UnicodeDecodeError:
            raise ConfigError(f"{flag} {run_dir}: {path} is not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError(f"{flag} {run_dir}: cannot read {path}: {_os_reason(exc)}") from None

    # -- outputs --------------------------------------------------------------
    def write_summary(self, summary: dict[str, Any]) -> None:
        self.jail.write_atomic("summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")

    def plot_learning_curve(self, rows: list[dict[str, Any]]) -> Path | None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        train = [(r["step"], r["episode/return"]) for r in rows if r.get("episode/return") is not None]
        evals = [(r["step"], r["eval/success_rate"]) for r in rows if r.get("eval/success_rate") is not None]
        if not train and not evals:
            return None
        fig, ax = plt.subplots(figsize=(7, 4))
        if train:
            ax.plot(*zip(*train), label="training episode return", color="tab:blue", alpha=0.8)
        if evals:
            ax.plot(*zip(*evals), "o-", label="evaluation success rate", color="tab:green")
        ax.set_xlabel("environment steps")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{self.config.agent} on {self.config.env_name} (seed {self.config.seed})")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        plt.close(fig)
        self.jail.write_atomic("learning_curve.png", png.getvalue())
        return self.path / "learning_curve.png"

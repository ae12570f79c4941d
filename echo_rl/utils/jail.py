"""Files inside a directory that is not trusted (a run directory): no symlinks, regular files only, bounded reads.

Why: a run directory may come from anyone (a download, a colleague, a shared disk). Its ``config.yaml`` names
paths, and any of its files may be a symlink, a FIFO or a device. Every read and write of a run's own files goes
through :class:`Jail`, so that

* a path stays inside the directory: it is relative, has no ``..``, and each component below the directory is
  opened with ``O_NOFOLLOW`` relative to its parent's descriptor, so no symlink is followed (the directory itself
  may be a symlink: the user named it);
* only regular files are read, each kind with a size cap (:data:`CAPS`), and opening a FIFO never blocks
  (``O_NONBLOCK``, then ``fstat``);
* a file is replaced atomically (temp file + rename in the same directory), so a refusal or a crash loses nothing;
* an ``.npz`` archive is checked before anything inflates (:func:`check_npz`).

Every refusal is a :class:`JailError`: a ``ConfigError``, one line, so the CLI exits 2.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import shutil
import stat
import zipfile
from pathlib import Path
from typing import IO

import numpy as np

from echo_rl.config.base import CONFIG_CAP, ConfigError

KiB, MiB, GiB = 2**10, 2**20, 2**30
# the most bytes read for each kind of file (npz: the inflated total of its members)
CAPS = {"pointer": 4 * KiB, "config": CONFIG_CAP, "json": 256 * MiB, "jsonl": 1 * GiB, "npz": 1 * GiB,
        "checkpoint": 64 * GiB}
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class JailError(ConfigError):
    """A path that leaves the directory, a symlink, a file that is not regular, or one over its size cap."""


def _cap(kind: str) -> int:
    if kind not in CAPS:
        raise ValueError(f"unknown file kind {kind!r}; allowed: {', '.join(CAPS)}")
    return CAPS[kind]


def _size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB" if n >= MiB else f"{n:,} bytes"


def parts_of(rel: str | os.PathLike, what: str = "path") -> tuple[str, ...]:
    """``rel`` as path components, refused when it is absolute, empty or climbs out with ``..``."""
    text = os.fspath(rel)
    parts = tuple(p for p in Path(text).parts if p not in ("", "."))
    if Path(text).is_absolute() or ".." in parts or not parts:
        raise JailError(f"{what} {text!r} is invalid: give a relative path inside the run directory (no '..')")
    return parts


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _checked_regular(fd: int, where: Path, kind: str | None) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise JailError(f"{where} is {_kind_of(st.st_mode)}; only regular files are read")
    if kind is not None and st.st_size > _cap(kind):
        raise JailError(f"{where} is {_size(st.st_size)}, over the {_size(_cap(kind))} cap for a {kind} file")
    return st


def _read_fd(fd: int, where: Path, kind: str) -> bytes:
    """All of a regular file, reading at most its cap (a file that grows while read is refused)."""
    _checked_regular(fd, where, kind)
    os.set_blocking(fd, True)
    with os.fdopen(os.dup(fd), "rb") as fh:
        data = fh.read(_cap(kind) + 1)
    if len(data) > _cap(kind):
        raise JailError(f"{where} is over the {_size(_cap(kind))} cap for a {kind} file")
    return data


def read_regular(path: str | os.PathLike, kind: str) -> bytes:
    """A file the user named (a symlink to it is fine), refused unless it is regular and within ``kind``'s cap."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return _read_fd(fd, path, kind)
    finally:
        os.close(fd)


def check_npz(source: bytes | np.ndarray | str | os.PathLike | IO[bytes], cap: int | None = None,
              where: str = "npz") -> None:
    """Refuse an npz whose members would inflate past ``cap`` bytes (default: the ``npz`` cap), before inflating:
    the zip headers' sizes are summed, and each member's npy header (shape x dtype) must fit its declared size.
    JailError for a bomb; ValueError for a damaged archive."""
    cap = CAPS["npz"] if cap is None else cap
    if isinstance(source, np.ndarray):
        source = source.tobytes()
    fh = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
    try:
        with zipfile.ZipFile(fh) as z:
            infos = z.infolist()
            total = sum(i.file_size for i in infos)
            if total > cap:
                raise JailError(f"{where} would inflate to {_size(total)}, over the {_size(cap)} cap")
            for info in infos:
                with z.open(info) as member:
                    shape, dtype = _npy_header(member)
                    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    if need > info.file_size:
                        raise JailError(f"{where}: member {info.filename} declares {_size(need)} of data in "
                                        f"{_size(info.file_size)}")
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        if isinstance(exc, JailError):
            raise
        raise ValueError(f"{where} is not a readable npz ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
                         ) from None


def _npy_header(member: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from an npy header, reading nothing past it."""
    fmt = np.lib.format
    version = fmt.read_magic(member)
    if version == (1, 0):
        shape, _, dtype = fmt.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, _, dtype = fmt.read_array_header_2_0(member)
    else:
        raise ValueError(f"npy format version {version} is not read (1.0 and 2.0 are)")
    return shape, dtype


class Jail:
    """A directory whose files are opened only through it; paths are relative to it (see the module docstring)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    # -- directories ----------------------------------------------------------------------------------------
    def _dir_fd(self, parts: tuple[str, ...], create: bool = False) -> int:
        """A descriptor of ``root/parts`` reached without following a symlink below root (made when ``create``)."""
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        walked = self.root
        try:
            for part in parts:
                walked = walked / part
                if create:
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
                try:
                    nfd = os.open(part, _DIR, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self._refusal(fd, part, walked, "directories") from None
                    raise
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _refusal(dir_fd: int, name: str, where: Path, wanted: str) -> JailError:
        try:
            got = _kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            got = "unusable"
        return JailError(f"{where} is {got}; a run directory holds {wanted} inside it (symlinks are not followed)")

    def _split(self, rel: str | os.PathLike) -> tuple[tuple[str, ...], str]:
        parts = parts_of(rel)
        return parts[:-1], parts[-1]

    def path(self, rel: str | os.PathLike, create: bool = False) -> Path:
        """``root/rel`` once checked to be a real directory inside root (made when ``create``): for writers that
        need a path (TensorBoard). A missing directory is fine unless ``create``."""
        parts = parts_of(rel)
        try:
            os.close(self._dir_fd(parts, create=create))
        except FileNotFoundError:
            if create:
                raise
        return self.root.joinpath(*parts)

    def entries(self, rel: str | os.PathLike, prefix: str = "") -> list[str]:
        """Names of the real directories (no symlinks) in ``root/rel`` that start with ``prefix``, sorted."""
        fd = self._dir_fd(parts_of(rel))
        try:
            return sorted(n for n in os.listdir(fd) if n.startswith(prefix)
                          and stat.S_ISDIR(os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode))
        finally:
            os.close(fd)

    def remove_tree(self, rel: str | os.PathLike) -> None:
        """Delete the directory ``root/rel`` and what it holds, if it is there; a symlink is never followed."""
        parents, name = self._split(rel)
        fd = self._dir_fd(parents)
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    # -- files ----------------------------------------------------------------------------------------------
    def _open(self, rel: str | os.PathLike, flags: int, create_dirs: bool = False) -> tuple[int, Path]:
        parents, name = self._split(rel)
        where = self.root.joinpath(*parents, name)
        dfd = self._dir_fd(parents, create=create_dirs)
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666, dir_fd=dfd), where
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise self._refusal(dfd, name, where, "regular files") from None
            raise
        finally:
            os.close(dfd)

    def is_file(self, rel: str | os.PathLike) -> bool:
        """Whether ``root/rel`` is a regular file reached without symlinks."""
        try:
            fd, _ = self._open(rel, os.O_RDONLY)
        except (OSError, JailError):
            return False
        try:
            return stat.S_ISREG(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    def read_bytes(self, rel: str | os.PathLike, kind: str) -> bytes:
        fd, where = self._open(rel, os.O_RDONLY)
        try:
            return _read_fd(fd, where, kind)
        finally:
            os.close(fd)

    def read_text(self, rel: str | os.PathLike, kind: str) -> str:
        return self.read_bytes(rel, kind).decode("utf-8")

    def open_read(self, rel: str | os.PathLike, kind: str) -> IO[bytes]:
        """A binary file object (for torch.load / np.load) of a regular file within ``kind``'s cap."""
        return os.fdopen(self._regular_fd(rel, os.O_RDONLY, kind), "rb")

    def open_append(self, rel: str | os.PathLike) -> IO[str]:
        """A text file opened for appending (created if missing), never through a symlink."""
        fd = self._regular_fd(rel, os.O_WRONLY | os.O_APPEND | os.O_CREAT, None, create_dirs=True)
        return os.fdopen(fd, "a", encoding="utf-8")

    def _regular_fd(self, rel: str | os.PathLike, flags: int, kind: str | None, create_dirs: bool = False) -> int:
        """A blocking descriptor of ``rel``, checked to be a regular file (within ``kind``'s cap when given)."""
        fd, where = self._open(rel, flags, create_dirs=create_dirs)
        try:
            _checked_regular(fd, where, kind)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write_atomic(self, rel: str | os.PathLike, data: bytes | str) -> None:
        """Replace ``root/rel`` with ``data``: a temp file in the same directory, then a rename (which replaces a
        symlink itself, never its target)."""
        parents, name = self._split(rel)
        dfd = self._dir_fd(parents, create=True)
        tmp = f".{name}-{secrets.token_hex(4)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data.encode("utf-8") if isinstance(data, str) else data)
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
        finally:
            os.close(dfd)

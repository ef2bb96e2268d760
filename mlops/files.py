"""File helpers every stage shares: content hashes, atomic and durable writes, an exclusive lock, a free local port.

Atomic means a reader sees the old file or the new one, never half of one (temp file + `os.replace`).
Durable (`fsync=True`) also survives a power cut: the data is on disk before the rename, and the folder entry
after it, which is what a checkpoint or a manifest that marks completion needs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


def file_sha256(path: Path | str) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


_HASHED: dict[tuple, str] = {}
_FILE_HASHES: dict[tuple, str] = {}


def file_manifest(folder: Path | str) -> dict[str, str]:
    """Every file of a folder by relative path -> sha256: what a registration signs and every load re-checks.
    A file's hash is remembered per process under its inode, size, mtime and ctime (see `folder_hash`)."""
    folder = Path(folder)
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        key = (str(path.resolve()), *_stamp(path))
        if key not in _FILE_HASHES:
            _FILE_HASHES[key] = file_sha256(path)
        out[path.relative_to(folder).as_posix()] = _FILE_HASHES[key]
    return out


def folder_hash(folder: Path | str, *, exclude: Iterable[str] = ()) -> str:
    """Content hash of a folder: every file's relative path and bytes in sorted order, minus `exclude`d names.

    Remembered per process under each file's inode, size, mtime and ctime: any write to a file moves its ctime
    (which no user can set back), so a remembered hash is never one of altered bytes."""
    folder = Path(folder)
    skip = set(exclude)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in skip)
    key = (str(folder.resolve()), tuple(sorted(skip)),
           tuple((p.relative_to(folder).as_posix(), *_stamp(p)) for p in files))
    if key not in _HASHED:
        _HASHED[key] = _hash_files(folder, files)
    return _HASHED[key]


def _stamp(path: Path) -> tuple:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _hash_files(folder: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode())
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(folder: Path | str) -> None:
    """Make a rename or a new file in `folder` durable."""
    fd = os.open(str(folder), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path | str, data: bytes, *, fsync: bool = False) -> Path:
    path = Path(path)
    # pid + random suffix: two threads or processes writing the same file never share a temp file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if fsync:
        fsync_dir(path.parent)
    return path


def atomic_write_text(path: Path | str, text: str, *, fsync: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def atomic_write_json(path: Path | str, obj: Any, *, fsync: bool = False) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n", fsync=fsync)


@contextlib.contextmanager
def exclusive_lock(path: Path | str) -> Iterator[None]:
    """Hold an advisory lock on `path` (created when missing) until the block ends. The kernel drops it when
    its holder dies, so a crashed holder never blocks the next one."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

"""Atomic file writes and JSON manifests, so no stage leaves a half-written output."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from clusterft.errors import OutputError

# the write failed for lack of room (full disk, file size limit, quota, read-only, I/O)
_DISK_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EIO}


def ensure_dir(path: str | Path) -> Path:
    """Create a folder (and parents); raise OutputError with the path if impossible."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{p}: cannot create output folder ({exc.strerror})") from exc
    if not os.access(p, os.W_OK):
        raise OutputError(f"{p}: output folder is not writable")
    return p


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it over `path` only if the block succeeds."""
    p = Path(path)
    ensure_dir(p.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as exc:
        raise OutputError(f"{p}: cannot write ({exc.strerror})") from exc
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, p)
    except OSError as exc:
        if isinstance(exc, OutputError) or exc.errno not in _DISK_ERRNOS and exc.errno is not None:
            raise  # (errno None: a short write, as numpy reports a full disk)
        raise OutputError(f"{p}: cannot write ({exc.strerror or exc}); the previous version, if any, is "
                          "unchanged and finished work is kept: free space, then rerun") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any) -> None:
    """Pretty, key-sorted JSON written atomically (byte-stable for the same content)."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def save_npy(path: str | Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, array, allow_pickle=False)


def load_npy(path: str | Path, mmap: bool = False) -> np.ndarray:
    return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class Stopwatch:
    """Wall-clock timer: `with Stopwatch() as sw: ...; sw.seconds`."""

    def __enter__(self) -> "Stopwatch":
        self.start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.start


def file_digest(path: str | Path) -> str:
    """sha1 of a file's bytes (inputs recorded in manifests, so stale outputs are refused)."""
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

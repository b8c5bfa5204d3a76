"""One run at a time per artifacts folder: an OS file lock that its holder's exit (a crash
included) releases, so two pipelines never overwrite each other's outputs and no stale lock
is left to delete by hand. Child processes (torchrun workers, the stages a Prefect flow
runs through `dvc repro`) inherit the holder's lock through an environment variable."""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from clusterft.errors import BusyError
from clusterft.io.artifacts import ensure_dir

LOCK_FILE = ".clusterft.lock"
LOCK_ENV = "CLUSTERFT_LOCK"  # the lock file an ancestor process holds for this one


@contextmanager
def artifacts_lock(folder: str | Path, what: str, wait: bool = False) -> Iterator[None]:
    """Hold `folder`'s lock for the block, or raise BusyError naming the run that holds it
    (`wait`: block until the holder exits instead).

    A no-op when an ancestor process holds the same lock (LOCK_ENV) or under torchrun (the
    launcher, or each node's own launcher, holds it)."""
    path = (ensure_dir(folder) / LOCK_FILE).resolve()
    if os.environ.get(LOCK_ENV) == str(path) or "LOCAL_RANK" in os.environ:
        yield
        return
    fh = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "a process that has not yet written its name"
        fh.close()
        raise BusyError(
            f"{folder}: another clusterft run is using this artifacts folder ({holder}). Two runs on "
            "one folder would overwrite each other's outputs: wait for it to finish, stop it (its "
            "lock is released when it exits, a crash included), or set paths.artifacts to another folder"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()}: {what}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    fh.flush()
    previous = os.environ.get(LOCK_ENV)
    os.environ[LOCK_ENV] = str(path)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(LOCK_ENV, None)
        else:
            os.environ[LOCK_ENV] = previous
        fh.seek(0)
        fh.truncate()
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()

"""A full disk, simulated: a file size limit for the current process."""

from __future__ import annotations

import resource
from contextlib import contextmanager


@contextmanager
def file_size_limit(nbytes):
    """Writes past `nbytes` fail with EFBIG, as on a full disk (Python ignores SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

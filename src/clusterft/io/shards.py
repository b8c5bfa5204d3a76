"""A resumable [N, D] float32 array built from fixed-size row shards, one .npy file each.

Shard files are written atomically (temp file + rename), so a shard file that exists with
the expected shape is complete: a killed run resumes by computing only the missing ones.
`spec.json` beside them records what the shards were computed from; a different spec
clears the folder so stale rows are never merged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from clusterft.io.artifacts import atomic_path, ensure_dir, read_json, write_json

SPEC_FILE = "spec.json"


def shard_ranges(n: int, size: int) -> list[tuple[int, int]]:
    """[(start, stop)] row ranges of `size` rows (the last may be shorter)."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def shard_path(folder: Path, index: int, rows: tuple[int, int]) -> Path:
    """File of shard `index`; its name carries the rows it covers."""
    return folder / f"shard-{index:05d}-rows-{rows[0]:09d}-{rows[1]:09d}.npy"


def shard_complete(path: Path, rows: tuple[int, int], dim: int) -> bool:
    """True when `path` holds a readable float32 [stop - start, dim] array."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return False
    return arr.dtype == np.float32 and arr.shape == (rows[1] - rows[0], dim)


def missing_shards(folder: Path, ranges: list[tuple[int, int]], dim: int) -> list[int]:
    """Indices of shards without a complete file."""
    return [i for i, r in enumerate(ranges) if not shard_complete(shard_path(folder, i, r), r, dim)]


def prepare_shard_dir(folder: Path, spec: dict[str, Any]) -> int:
    """Keep shards only if they were made under `spec`; drop leftover temp files.

    Returns the number of shard files removed because the spec changed."""
    ensure_dir(folder)
    for tmp in folder.glob(".*.tmp"):
        tmp.unlink()
    spec_path = folder / SPEC_FILE
    removed = 0
    if not spec_path.exists() or read_json(spec_path) != spec:
        for old in folder.glob("shard-*.npy"):
            old.unlink()
            removed += 1
        write_json(spec_path, spec)
    return removed


def merge_shards(folder: Path, ranges: list[tuple[int, int]], dim: int, out: Path) -> None:
    """Concatenate every shard into `out` [N, dim] float32, atomically, one shard in memory."""
    n = ranges[-1][1] if ranges else 0
    with atomic_path(out) as tmp:
        merged = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, dim))
        for i, r in enumerate(ranges):
            merged[r[0] : r[1]] = np.load(shard_path(folder, i, r), allow_pickle=False)
        merged.flush()
        del merged


def remove_shard_dir(folder: Path) -> None:
    """Delete the shards and their spec once merged (the merged array replaces them)."""
    for f in list(folder.glob("shard-*.npy")) + [folder / SPEC_FILE]:
        f.unlink(missing_ok=True)
    if not any(folder.iterdir()):
        folder.rmdir()

"""Seeded random projections generated in row blocks, so the P x dim matrix never has to fit.

Row block j (rows j*BLOCK_ROWS ...) is drawn from numpy's generator seeded with (seed, j),
so a seed names one matrix on every device, whether it is cached whole or regenerated
block by block. Entries are +-1/sqrt(dim) (Rademacher) or N(0, 1/dim) (Gaussian), so
squared norms are preserved in expectation (Johnson-Lindenstrauss).
"""

from __future__ import annotations

import math

import numpy as np
import torch

PROJECTIONS = ("rademacher", "gaussian")
BLOCK_ROWS = 1024  # part of the matrix's definition: changing it changes every matrix


def projection_block(kind: str, seed: int, block: int, rows: int, dim: int) -> np.ndarray:
    """Rows [block*BLOCK_ROWS, +rows) of the projection matrix: [rows, dim] float32."""
    rng = np.random.default_rng([seed, block])
    scale = np.float32(1.0 / math.sqrt(dim))
    if kind == "gaussian":
        out = rng.standard_normal((rows, dim), dtype=np.float32)
        out *= scale
        return out
    if kind != "rademacher":
        raise ValueError(f"unknown projection {kind!r}; known: {PROJECTIONS}")
    n = rows * dim
    bits = np.unpackbits(rng.integers(0, 256, size=(n + 7) // 8, dtype=np.uint8), count=n)
    out = bits.astype(np.float32).reshape(rows, dim)
    out *= -2.0 * scale  # bit 0 -> +scale, bit 1 -> -scale
    out += scale
    return out


def block_starts(n_in: int) -> range:
    """First row of every block of an [n_in, dim] matrix."""
    return range(0, n_in, BLOCK_ROWS)


def projection_matrix(kind: str, seed: int, n_in: int, dim: int) -> np.ndarray:
    """The whole [n_in, dim] float32 matrix (all blocks stacked)."""
    return np.concatenate([
        projection_block(kind, seed, s // BLOCK_ROWS, min(BLOCK_ROWS, n_in - s), dim)
        for s in block_starts(n_in)
    ])


class RandomProjection:
    """x [B, n_in] -> x @ R [B, dim]; R is cached on `device` when it fits `cache_mb`,
    else regenerated block by block on every call (memory: one block, BLOCK_ROWS x dim)."""

    def __init__(self, n_in: int, dim: int, kind: str = "rademacher", seed: int = 0,
                 cache_mb: float = 2048.0, device: torch.device | str = "cpu") -> None:
        if kind not in PROJECTIONS:
            raise ValueError(f"unknown projection {kind!r}; known: {PROJECTIONS}")
        self.n_in, self.dim, self.kind, self.seed = n_in, dim, kind, seed
        self.device = torch.device(device)
        self.matrix: torch.Tensor | None = None
        if n_in * dim * 4 <= cache_mb * 2**20:
            self.matrix = torch.from_numpy(projection_matrix(kind, seed, n_in, dim)).to(self.device)

    @property
    def cached(self) -> bool:
        return self.matrix is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[B, n_in] float32 -> [B, dim] float32."""
        if x.shape[-1] != self.n_in:
            raise ValueError(f"projection expects {self.n_in} columns, got {x.shape[-1]}")
        if self.matrix is not None:
            return x @ self.matrix
        out = torch.zeros(x.shape[0], self.dim, dtype=x.dtype, device=x.device)
        for s in block_starts(self.n_in):
            rows = min(BLOCK_ROWS, self.n_in - s)
            block = projection_block(self.kind, self.seed, s // BLOCK_ROWS, rows, self.dim)
            out.addmm_(x[:, s : s + rows], torch.from_numpy(block).to(x.device))
        return out

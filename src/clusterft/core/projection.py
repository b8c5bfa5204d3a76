"""Seeded random projections generated in row blocks, so the P x dim matrix never has to fit.

Row block j (rows j*BLOCK_ROWS ...) is drawn from numpy's generator seeded with (seed, j),
so a seed names one matrix on every device, whether it is cached whole or regenerated
block by block. Entries are +-1/sqrt(dim) (Rademacher), N(0, 1/dim) (Gaussian), or, for
`sparse`, +-sqrt(s/dim) with probability 1/(2s) each and 0 otherwise, s = sqrt(n_in) (the
"very sparse" projection of Li, Hastie & Church, 2006): squared norms are preserved in
expectation (Johnson-Lindenstrauss) by all three. The sparse matrix has n_in*dim/s
non-zeros (5.6M for SmolLM2-135M's 460,800 LoRA weights at dim 8192: 67 MB instead of a
15 GB dense matrix), so it is always cached and applied as one sparse x dense product.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

PROJECTIONS = ("rademacher", "gaussian", "sparse")
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


def sparse_s(n_in: int) -> float:
    """The sparsity parameter s of an n_in-row sparse projection: 1 in s entries is non-zero."""
    return max(3.0, math.sqrt(n_in))  # Li et al.'s sqrt(D); Achlioptas' 3 for tiny inputs


def sparse_block(seed: int, block: int, rows: int, dim: int, n_in: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Non-zeros of rows [block*BLOCK_ROWS, +rows) of the sparse projection of an n_in-row
    matrix: (row within the block, column, value), sorted by (row, column)."""
    rng = np.random.default_rng([seed, block])
    s = sparse_s(n_in)
    count = rng.binomial(rows * dim, 1.0 / s)
    flat = np.unique(rng.integers(0, rows * dim, size=count, dtype=np.int64))
    values = np.where(rng.integers(0, 2, size=flat.size) == 1, 1.0, -1.0).astype(np.float32)
    values *= np.float32(math.sqrt(s / dim))
    return flat // dim, flat % dim, values


def sparse_projection_t(seed: int, n_in: int, dim: int) -> torch.Tensor:
    """The transposed sparse projection R^T [dim, n_in] as a torch CSR tensor (float32)."""
    rows, cols, vals = [], [], []
    for s in block_starts(n_in):
        r, c, v = sparse_block(seed, s // BLOCK_ROWS, min(BLOCK_ROWS, n_in - s), dim, n_in)
        rows.append(r + s)
        cols.append(c)
        vals.append(v)
    index = torch.from_numpy(np.stack([np.concatenate(cols), np.concatenate(rows)]))
    coo = torch.sparse_coo_tensor(index, torch.from_numpy(np.concatenate(vals)), (dim, n_in),
                                  check_invariants=False)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": matmul is all we use
        warnings.simplefilter("ignore", UserWarning)
        return coo.coalesce().to_sparse_csr()


def block_starts(n_in: int) -> range:
    """First row of every block of an [n_in, dim] matrix."""
    return range(0, n_in, BLOCK_ROWS)


def projection_matrix(kind: str, seed: int, n_in: int, dim: int) -> np.ndarray:
    """The whole [n_in, dim] float32 matrix (all blocks stacked; dense, also for `sparse`)."""
    if kind == "sparse":
        return sparse_projection_t(seed, n_in, dim).to_dense().T.contiguous().numpy()
    return np.concatenate([
        projection_block(kind, seed, s // BLOCK_ROWS, min(BLOCK_ROWS, n_in - s), dim)
        for s in block_starts(n_in)
    ])


class RandomProjection:
    """x [B, n_in] -> x @ R [B, dim]. A dense R is cached on `device` when it fits
    `cache_mb`, else regenerated block by block on every call (memory: one block,
    BLOCK_ROWS x dim); a sparse R is always cached (n_in * dim / sqrt(n_in) non-zeros)."""

    def __init__(self, n_in: int, dim: int, kind: str = "rademacher", seed: int = 0,
                 cache_mb: float = 2048.0, device: torch.device | str = "cpu") -> None:
        if kind not in PROJECTIONS:
            raise ValueError(f"unknown projection {kind!r}; known: {PROJECTIONS}")
        self.n_in, self.dim, self.kind, self.seed = n_in, dim, kind, seed
        self.device = torch.device(device)
        self.matrix: torch.Tensor | None = None
        self.sparse_t: torch.Tensor | None = None
        if kind == "sparse":
            self.sparse_t = sparse_projection_t(seed, n_in, dim).to(self.device)
        elif n_in * dim * 4 <= cache_mb * 2**20:
            self.matrix = torch.from_numpy(projection_matrix(kind, seed, n_in, dim)).to(self.device)

    @property
    def cached(self) -> bool:
        return self.matrix is not None or self.sparse_t is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[B, n_in] -> [B, dim] float32; always computed in fp32 (outside any autocast), so
        half-precision gradients are projected without a second rounding."""
        if x.shape[-1] != self.n_in:
            raise ValueError(f"projection expects {self.n_in} columns, got {x.shape[-1]}")
        with torch.autocast(x.device.type, enabled=False):
            return self._project(x.float())

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        if self.sparse_t is not None:
            return (self.sparse_t @ x.T).T
        if self.matrix is not None:
            return x @ self.matrix
        out = torch.zeros(x.shape[0], self.dim, dtype=x.dtype, device=x.device)
        for s in block_starts(self.n_in):
            rows = min(BLOCK_ROWS, self.n_in - s)
            block = projection_block(self.kind, self.seed, s // BLOCK_ROWS, rows, self.dim)
            out.addmm_(x[:, s : s + rows], torch.from_numpy(block).to(x.device))
        return out

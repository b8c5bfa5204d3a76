"""Random projections of the gradients: seeded, the same whether cached or made block by block, norms kept."""

import numpy as np
import pytest
import torch

from clusterft.core.projection import (
    BLOCK_ROWS,
    RandomProjection,
    projection_block,
    projection_matrix,
)


@pytest.mark.parametrize("kind", ["rademacher", "gaussian"])
def test_projection_is_seeded_and_blockwise_equals_cached(kind):
    n_in, dim = 2 * BLOCK_ROWS + 300, 64  # a short last block
    x = torch.randn(5, n_in)
    cached = RandomProjection(n_in, dim, kind, seed=3)
    blockwise = RandomProjection(n_in, dim, kind, seed=3, cache_mb=0)
    assert cached.cached and not blockwise.cached
    full = torch.from_numpy(projection_matrix(kind, 3, n_in, dim))
    torch.testing.assert_close(cached(x), x @ full)
    torch.testing.assert_close(blockwise(x), x @ full, rtol=1e-5, atol=1e-5)
    again = projection_matrix(kind, 3, n_in, dim)
    np.testing.assert_array_equal(again, full.numpy())
    assert not np.array_equal(projection_matrix(kind, 4, n_in, dim), again)
    np.testing.assert_array_equal(again[BLOCK_ROWS : 2 * BLOCK_ROWS],
                                  projection_block(kind, 3, 1, BLOCK_ROWS, dim))


def test_rademacher_entries_and_norms():
    r = projection_block("rademacher", 0, 0, 512, 256)
    assert set(np.unique(r)) == {np.float32(-1 / 16), np.float32(1 / 16)}
    assert abs((r > 0).mean() - 0.5) < 0.01
    x = torch.randn(20, 4000)
    y = RandomProjection(4000, 2048, "rademacher", seed=1)(x)
    ratio = y.norm(dim=1) / x.norm(dim=1)
    assert ((ratio > 0.9) & (ratio < 1.1)).all()  # JL: norms kept up to a few percent


def test_sparse_projection_is_seeded_sparse_and_keeps_norms():
    from clusterft.core.projection import sparse_s

    n_in, dim = 2 * BLOCK_ROWS + 300, 512
    proj = RandomProjection(n_in, dim, "sparse", seed=3, cache_mb=0)  # always cached: it is small
    dense = projection_matrix("sparse", 3, n_in, dim)
    s = sparse_s(n_in)
    assert proj.cached and proj.sparse_t._nnz() == np.count_nonzero(dense)
    assert abs(np.count_nonzero(dense) / dense.size - 1 / s) < 0.1 / s
    np.testing.assert_allclose(np.unique(np.abs(dense[dense != 0])), np.sqrt(s / dim), rtol=1e-6)
    np.testing.assert_array_equal(projection_matrix("sparse", 3, n_in, dim), dense)
    assert not np.array_equal(projection_matrix("sparse", 4, n_in, dim), dense)
    x = torch.randn(6, n_in)
    torch.testing.assert_close(proj(x), x @ torch.from_numpy(dense), rtol=1e-4, atol=1e-4)
    x = torch.randn(20, 40_000)
    ratio = RandomProjection(40_000, 4096, "sparse", seed=1)(x).norm(dim=1) / x.norm(dim=1)
    assert ((ratio > 0.9) & (ratio < 1.1)).all()

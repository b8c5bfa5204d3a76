import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from clusterft.clustering import ClusteringError, kmeans, l2_normalize


def blobs(n_per=50, k=4, d=16, seed=0):
    rng = np.random.default_rng(seed)
    dirs = rng.normal(size=(k, d))
    x = np.concatenate([dirs[i] * rng.uniform(1, 5) + 0.05 * rng.normal(size=(n_per, d)) for i in range(k)])
    return x.astype(np.float32), np.repeat(np.arange(k), n_per)


def test_kmeans_recovers_directions_regardless_of_scale():
    x, y = blobs()
    x = x * np.random.default_rng(1).uniform(0.1, 10, size=(len(x), 1))  # norms vary; directions don't
    c = kmeans(x, 4, n_init=4, seed=0)
    assert adjusted_rand_score(y, c.labels) == pytest.approx(1.0)
    assert c.sizes.sum() == len(x) and c.centers.shape == (4, x.shape[1])


def test_k_larger_than_n_and_k_below_one_are_errors():
    x, _ = blobs(n_per=2, k=2)
    with pytest.raises(ClusteringError, match="larger than the number of samples"):
        kmeans(x, 5)
    with pytest.raises(ClusteringError, match=">= 1"):
        kmeans(x, 0)


def test_nan_rows_are_reported():
    x, _ = blobs()
    x[3, 0] = np.nan
    x[7, 1] = np.inf
    with pytest.raises(ClusteringError, match=r"2 rows contain NaN/inf \(first rows \[3, 7\]\)"):
        kmeans(x, 2)


def test_l2_normalize_rows():
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(l2_normalize(x), [[0.6, 0.8], [0.0, 0.0]])

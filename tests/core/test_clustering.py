import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from clusterft.core.clustering import kmeans, l2_normalize
from clusterft.errors import ClusteringError


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


def test_faiss_backend_on_a_memmap_matches_exact_kmeans(tmp_path):
    from clusterft.core.clustering import cluster_features

    x, y = blobs(n_per=400, k=6, d=32)
    path = tmp_path / "f.npy"
    np.save(path, x)
    mm = np.load(path, mmap_mode="r")
    c, backend = cluster_features(mm, 6, n_init=2, seed=0, backend="auto", large_threshold=1000)
    assert backend == "faiss" and c.labels.shape == (2400,)
    assert adjusted_rand_score(y, c.labels) > 0.99
    exact, b2 = cluster_features(x, 6, n_init=2, seed=0)
    assert b2 == "sklearn" and adjusted_rand_score(exact.labels, c.labels) > 0.99


def test_auto_k_finds_the_number_of_directions():
    from clusterft.core.clustering import choose_k

    x, _ = blobs(n_per=60, k=6, d=24, seed=3)
    k, scores = choose_k(x, 2, 16, sample=360, seed=0)
    assert k == 6 and scores[6] == max(scores.values())

"""A resumable array from row shards: ranges cover every row once, missing shards are found,
a changed spec drops the old shards, and the merge equals the rows in order."""

import numpy as np

from clusterft.io.artifacts import save_npy
from clusterft.io.shards import (
    merge_shards,
    missing_shards,
    prepare_shard_dir,
    remove_shard_dir,
    shard_path,
    shard_ranges,
)


def test_ranges_cover_every_row_once():
    ranges = shard_ranges(1030, 256)
    assert ranges[0] == (0, 256) and ranges[-1] == (1024, 1030)
    assert np.concatenate([np.arange(a, b) for a, b in ranges]).tolist() == list(range(1030))
    assert shard_ranges(0, 8) == []


def test_missing_then_merged_in_order_then_removed(tmp_path):
    rows = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    ranges = shard_ranges(10, 4)
    folder = tmp_path / "shards"
    assert prepare_shard_dir(folder, {"kind": "a"}) == 0
    for i in (0, 2):
        save_npy(shard_path(folder, i, ranges[i]), rows[slice(*ranges[i])])
    assert missing_shards(folder, ranges, 3) == [1]
    save_npy(shard_path(folder, 1, ranges[1]), rows[slice(*ranges[1])][:, :2])  # wrong width: not complete
    assert missing_shards(folder, ranges, 3) == [1]
    save_npy(shard_path(folder, 1, ranges[1]), rows[slice(*ranges[1])])
    assert missing_shards(folder, ranges, 3) == []
    merge_shards(folder, ranges, 3, tmp_path / "all.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "all.npy"), rows)
    remove_shard_dir(folder)
    assert not folder.exists()


def test_a_new_spec_drops_the_old_shards_and_leftover_temp_files(tmp_path):
    folder = tmp_path / "shards"
    prepare_shard_dir(folder, {"kind": "a"})
    save_npy(shard_path(folder, 0, (0, 2)), np.zeros((2, 1), np.float32))
    (folder / ".shard-00001.npy.123.tmp").write_bytes(b"half")
    assert prepare_shard_dir(folder, {"kind": "a"}) == 0  # same spec: kept
    assert not list(folder.glob(".*.tmp"))
    assert prepare_shard_dir(folder, {"kind": "b"}) == 1
    assert missing_shards(folder, [(0, 2)], 1) == [0]

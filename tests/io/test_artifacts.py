"""Atomic outputs: a write that fails for lack of room (simulated full disk) leaves the
previous version and no temp file, and says which file could not be written."""

import json

import numpy as np
import pytest

from clusterft.errors import OutputError
from clusterft.io.artifacts import atomic_path, save_npy, write_json
from tests.helpers.limits import file_size_limit


def test_full_disk_keeps_the_previous_output(tmp_path):
    out = tmp_path / "metrics.json"
    write_json(out, {"version": 1})
    with file_size_limit(256), pytest.raises(OutputError) as err:
        write_json(out, {"rows": list(range(1000))})
    assert str(out) in str(err.value) and "unchanged" in str(err.value)
    assert json.loads(out.read_text()) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_full_disk_on_an_array(tmp_path):
    out = tmp_path / "features.npy"
    with file_size_limit(1024), pytest.raises(OutputError, match="features.npy: cannot write"):
        save_npy(out, np.zeros((100, 100), np.float32))
    assert list(tmp_path.iterdir()) == []


def test_other_errors_are_not_disguised(tmp_path):
    with pytest.raises(ValueError):
        with atomic_path(tmp_path / "x"):
            raise ValueError("not a disk problem")
    assert list(tmp_path.iterdir()) == []

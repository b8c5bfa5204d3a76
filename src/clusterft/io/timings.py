"""What stages took: the probe's timings of the training setup (and whether they still hold
for the current setup) and every once-per-dataset selection stage's wall-clock."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from clusterft.errors import SelectionError
from clusterft.io.artifacts import read_json, write_json
from clusterft.spec.config import to_dict
from clusterft.spec.stages import LATER_KEYS, PROBE_TRAIN_KEYS, STAGES, stage


def probe_digest(cfg: Any) -> str:
    """Hash of what sets training speed (not seeds or the learning rate; LATER_KEYS at their old
    value, so probes made before them hold) and of the train data."""
    speed = {k: getattr(cfg.train, k) for k in PROBE_TRAIN_KEYS if k not in ("seed", "timeout_s")
             and LATER_KEYS.get(f"train.{k}", ...) != getattr(cfg.train, k)}
    doc = {"train": speed, "lora": to_dict(cfg.lora), "model": to_dict(cfg.model), "data": to_dict(cfg.data),
           "steps": cfg.select.probe_steps}
    h = hashlib.sha1(json.dumps(doc, sort_keys=True).encode())
    p = Path(cfg.data.train)
    h.update(p.read_bytes() if p.exists() else b"-")
    return h.hexdigest()


def read_probe(cfg: Any) -> dict[str, Any]:
    """The probe's measurements for the current training setup; refused when missing,
    skipped or made for another setup."""
    path = stage("probe").metrics_path(cfg)
    m = read_json(path) if path.exists() else {"skipped": True}
    if m.get("skipped"):
        raise SelectionError(f"{path}: select.time_budget needs the training probe; run `clusterft probe` "
                             "with select.time_budget set (`dvc repro` does)")
    if m.get("digest") != probe_digest(cfg):
        raise SelectionError(f"{path}: the probe timed another training setup or data; rerun "
                             "`clusterft probe` (`dvc repro` does)")
    return m


SHARED_TIMES = "shared_times.json"  # in a run folder: the shared stages' seconds when the run was made


def write_shared_times(cfg: Any, run_dir: Path) -> None:
    """Fix in a run folder what the once-per-dataset selection stages took when it was made."""
    write_json(Path(run_dir) / SHARED_TIMES, shared_times(cfg))


def shared_times(cfg: Any, run_dir: Path | None = None) -> dict[str, float]:
    """Wall-clock of the once-per-dataset selection stages: as a run folder recorded them
    (SHARED_TIMES), else as their metrics say now (0 when absent)."""
    if run_dir is not None and (Path(run_dir) / SHARED_TIMES).exists():
        return read_json(Path(run_dir) / SHARED_TIMES)
    out = {}
    for st in STAGES:
        if st.selection:
            p = st.metrics_path(cfg)
            out[st.name] = read_json(p)["wall_clock_s"] if p.exists() else 0.0
    return out

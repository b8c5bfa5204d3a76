"""The probe's digest: what sets training speed, with params added later at their old value left out."""

from clusterft.io import timings
from clusterft.spec.config import load_config


def test_a_probe_made_before_fast_loss_existed_holds_at_its_old_value(monkeypatch):
    old, new = load_config(None, ["train.fast_loss=false"]), load_config(None)
    held, faster = timings.probe_digest(old), timings.probe_digest(new)
    assert faster != held  # the fast loss trains at another speed: a new probe
    monkeypatch.setattr(timings, "PROBE_TRAIN_KEYS", tuple(k for k in timings.PROBE_TRAIN_KEYS if k != "fast_loss"))
    assert timings.probe_digest(old) == held  # the digest before the key was added

import pytest

from clusterft.config import ConfigError, load_config
from tests.conftest import REPO


def test_repo_params_load_with_documented_defaults():
    cfg = load_config(REPO / "params.yaml")
    assert cfg.cluster.k == 16 and cfg.train.nproc == 2
    assert cfg.select.methods[0] == "full"


def test_unknown_key_names_file_and_key_with_suggestion(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text("select:\n  budgt: 0.3\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert str(p) in msg and "select.budgt" in msg and "did you mean 'budget'" in msg


@pytest.mark.parametrize(
    "text, key",
    [
        ("train:\n  nproc: two\n", "train.nproc"),
        ("select:\n  budget: [1]\n", "select.budget"),
        ("model:\n  trust_remote_code: 1\n", "model.trust_remote_code"),
        ("lora:\n  target_modules: q_proj\n", "lora.target_modules"),
        ("select:\n  budget: 0\n", "select.budget"),
        ("select:\n  budget: 1.5\n", "select.budget"),
        ("cluster:\n  k: 0\n", "cluster.k"),
        ("train:\n  finetune: half\n", "train.finetune"),
        ("select:\n  methods: [full, magic]\n", "select.methods"),
        ("train: 3\n", "train"),
    ],
)
def test_wrong_types_and_ranges_are_rejected_with_the_key(tmp_path, text, key):
    p = tmp_path / "params.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(p)


def test_overrides_apply_and_are_type_checked():
    cfg = load_config(None, ["select.budget=0.3", "cluster.k=7", "lora.target_modules=[q_proj]"])
    assert cfg.select.budget == 0.3 and cfg.cluster.k == 7 and cfg.lora.target_modules == ["q_proj"]
    with pytest.raises(ConfigError, match="cluster.k"):
        load_config(None, ["cluster.k=many"])


def test_invalid_yaml_names_the_file(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text("select: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(p)

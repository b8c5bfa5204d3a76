import pytest

from clusterft.errors import ConfigError
from clusterft.spec.config import load_config, params_markdown
from tests.conftest import REPO


def test_a_partial_params_file_changes_only_what_it_names(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text("cluster:\n  k: 5\ntrain:\n  lr: 0.01\n")
    got, default = load_config(p).model_dump(), load_config(None).model_dump()
    assert got["cluster"] == {**default["cluster"], "k": 5} and got["train"] == {**default["train"], "lr": 0.01}
    assert {s: v for s, v in got.items() if s not in ("cluster", "train")} == \
        {s: v for s, v in default.items() if s not in ("cluster", "train")}


def test_repo_params_yaml_lists_every_param_with_its_default():
    """DVC reads params.yaml itself: a param missing there fails `dvc repro` for every stage
    that depends on it, so every param is written out, at its default."""
    import yaml

    from clusterft.spec.config import PipelineConfig, flatten, to_dict

    written = flatten(yaml.safe_load((REPO / "params.yaml").read_text()))
    defaults = flatten(to_dict(PipelineConfig()))
    assert sorted(set(defaults) - set(written)) == []
    differs = {k for k in defaults if k in written and written[k] != defaults[k]}
    assert differs <= {"model.path", "data.train", "data.validation", "data.test", "paths.artifacts"}, differs


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
        ("train:\n  lr: -0.1\n", "train.lr"),
        ("warmup:\n  lr: -0.002\n", "warmup.lr"),
        ("train:\n  log_every: 0\n", "train.log_every"),
        ("train:\n  warmup_ratio: 5\n", "train.warmup_ratio"),
        ("train:\n  weight_decay: -1\n", "train.weight_decay"),
        ("select:\n  alpha: -3\n", "select.alpha"),
        ("lora:\n  r: 0\n", "lora.r"),
        ("lora:\n  dropout: 1.5\n", "lora.dropout"),
        ("train:\n  checkpoint_every: -5\n", "train.checkpoint_every"),
        ("train:\n  max_restarts: -1\n", "train.max_restarts"),
        ("evaluate:\n  max_new_tokens: 0\n", "evaluate.max_new_tokens"),
        ("cluster:\n  n_init: 0\n", "cluster.n_init"),
        ("select:\n  paper_ratio: 0\n", "select.paper_ratio"),
        ("select:\n  within: farthest\n", "select.within"),
        ("select:\n  split: even\n", "select.split"),
        ("cluster:\n  backend: gpu\n", "cluster.backend"),
        ("cluster:\n  k_min: 10\n  k_max: 5\n", "cluster.k_max"),
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


def test_readme_param_table_is_the_generated_one():
    readme = (REPO / "README.md").read_text()
    table = readme.split("<!-- params:begin -->\n", 1)[1].split("<!-- params:end -->", 1)[0]
    assert table.strip() == params_markdown().strip(), "run `clusterft params --markdown` into the README"

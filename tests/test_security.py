"""Security properties: safetensors-only weights, no remote code unless asked, no pickle on
user data, no shell strings, and servers/docs bound to 127.0.0.1."""

import ast
import re

import pytest
import torch

from clusterft.errors import ModelError
from clusterft.runtime.model import load_model, load_tokenizer
from clusterft.spec.config import ModelConfig
from tests.conftest import REPO

CODE = sorted((REPO / "src").rglob("*.py")) + sorted((REPO / "flows").glob("*.py"))
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def _no_torch_load(*args, **kwargs):
    raise AssertionError("torch.load (pickle) was called while loading a model")


def test_folder_with_only_pytorch_model_bin_is_refused_before_anything_reads_it(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    bin_only = tmp_path / "bin_only"
    bin_only.mkdir()
    (bin_only / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    torch.save(load_model(tiny_model_dir).state_dict(), bin_only / "pytorch_model.bin")
    monkeypatch.setattr(torch, "load", _no_torch_load)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", _no_torch_load)
    with pytest.raises(ModelError, match=r"no \*\.safetensors weights.*pickle"):
        load_model(bin_only)


def test_weights_load_through_safetensors_even_beside_a_pickle_file(tiny_model_dir, tmp_path, monkeypatch):
    both = tmp_path / "both"
    both.mkdir()
    for f in tiny_model_dir.iterdir():
        (both / f.name).write_bytes(f.read_bytes())
    torch.save({"not": torch.zeros(1)}, both / "pytorch_model.bin")  # would break loading if read
    monkeypatch.setattr(torch, "load", _no_torch_load)
    model = load_model(both)
    assert sum(p.numel() for p in model.parameters()) > 0


class _Captured:
    def __init__(self):
        self.calls = []

    def __call__(self, path, **kwargs):
        self.calls.append(kwargs)
        return type("Tok", (), {"eos_token_id": 1, "pad_token_id": 0})()


@pytest.mark.parametrize("allow", [False, True])
def test_trust_remote_code_is_passed_from_config_only(tiny_model_dir, monkeypatch, allow):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_calls, tok_calls = _Captured(), _Captured()
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", model_calls)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", tok_calls)
    mcfg = ModelConfig(trust_remote_code=allow) if allow else ModelConfig()
    load_model(tiny_model_dir, mcfg)
    load_tokenizer(tiny_model_dir, mcfg)
    assert model_calls.calls[0]["trust_remote_code"] is allow and model_calls.calls[0]["use_safetensors"] is True
    assert tok_calls.calls[0]["trust_remote_code"] is allow


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def _kw(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


def test_no_torch_load_without_weights_only_and_no_pickle_in_sources():
    bad = []
    for path in CODE:
        tree = ast.parse(path.read_text(), str(path))
        where = lambda n: f"{path.relative_to(REPO)}:{n.lineno}"  # noqa: E731
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad += [f"{where(node)} imports {a.name}" for a in node.names if a.name.split(".")[0] in PICKLE_MODULES]
            elif isinstance(node, ast.ImportFrom):
                if (node.module or "").split(".")[0] in PICKLE_MODULES:
                    bad.append(f"{where(node)} imports from {node.module}")
                if node.module == "torch" and any(a.name == "load" for a in node.names):
                    bad.append(f"{where(node)} imports torch.load by name")
        for call, func in _calls(tree):
            weights_only = _kw(call, "weights_only")
            if func == "torch.load" and not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                bad.append(f"{where(call)} torch.load without weights_only=True")
            allow = _kw(call, "allow_pickle")
            if func.endswith(".load") and isinstance(allow, ast.Constant) and allow.value is True:
                bad.append(f"{where(call)} {func}(allow_pickle=True)")
            if func in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "pd.read_pickle", "pandas.read_pickle"):
                bad.append(f"{where(call)} {func}")
            shell = _kw(call, "shell")
            if isinstance(shell, ast.Constant) and shell.value is True:
                bad.append(f"{where(call)} {func}(shell=True)")
            if func.endswith("from_pretrained"):
                trust = _kw(call, "trust_remote_code")
                if isinstance(trust, ast.Constant) and trust.value is True:
                    bad.append(f"{where(call)} hard-codes trust_remote_code=True")
    assert not bad, "\n".join(bad)


def test_the_source_scan_sees_what_it_should_refuse():
    """Guard against a scan that silently matches nothing."""
    tree = ast.parse("import torch\nimport pickle\nx = torch.load(f)\ny = torch.load(f, weights_only=True)\n")
    calls = [c for c, f in _calls(tree) if f == "torch.load"]
    assert len(calls) == 2 and _kw(calls[0], "weights_only") is None
    assert any(isinstance(n, ast.Import) and n.names[0].name in PICKLE_MODULES for n in ast.walk(tree))
    assert len(CODE) > 10 and any(p.name == "model.py" for p in CODE)


def test_servers_and_docs_bind_to_localhost_only():
    files = [*sorted((REPO / "scripts").glob("*.sh")), *sorted((REPO / "flows").glob("*.py")),
             REPO / "Dockerfile", REPO / "README.md", *[p for p in [REPO / "prefect.yaml"] if p.exists()]]
    files += sorted((REPO / "src").rglob("*.py"))
    bad = []
    for path in files:
        text = path.read_text()
        for m in re.finditer(r"0\.0\.0\.0|::/0|--host[= ]+(\S+)|--bind[= ]+(\S+)|host\s*=\s*['\"]([^'\"]+)", text):
            value = next((g for g in m.groups() if g), m.group(0)).strip("'\"`")
            if value not in ("127.0.0.1", "localhost"):
                bad.append(f"{path.relative_to(REPO)}: {m.group(0)!r}")
    assert not bad, "\n".join(bad)
    deploy = (REPO / "flows" / "deploy.py").read_text()
    assert "prefect server start --host 127.0.0.1" in deploy and "PREFECT_API_URL=http://127.0.0.1" in deploy

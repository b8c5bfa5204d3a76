"""A real DVC project in a temporary folder: the repo's generated DVC files, a copy of
src/ (the stages' code dependencies) and a params.yaml; `dvc` runs in it as a user's would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, write_params


def env() -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "DVC_NO_ANALYTICS": "1", "PYTHONPATH": str(REPO / "src")}


def make_project(root: Path, params: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dvc.yaml", root)
    (root / "experiments").mkdir(exist_ok=True)
    shutil.copy(REPO / "experiments" / "dvc.yaml", root / "experiments")
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    write_params(root, params)
    shutil.copy(REPO / ".gitignore", root)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    dvc(root, "init", "-q")
    return root


def commit(root: Path, message: str = "baseline") -> None:
    """A git commit of the project, as `dvc exp` needs a baseline."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", message], cwd=root, check=True)


def dvc(root: Path, *args: str, ok: bool = True) -> str:
    res = subprocess.run(["dvc", *args], cwd=root, env=env(), capture_output=True, text=True, timeout=900)
    if ok:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout + res.stderr


def ran(output: str) -> set[str]:
    """Stages `dvc repro` ran (not the ones it skipped as unchanged)."""
    return set(re.findall(r"Running stage '([^']+)'", output))

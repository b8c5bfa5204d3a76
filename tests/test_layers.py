"""The folder tree is the architecture, and a check keeps it: each layer imports only the
layers below it (import-linter, pyproject.toml), no package import hides in a function
without its reason, functions stay short, and importing clusterft changes nothing."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SRC = REPO / "src" / "clusterft"


def test_layers_contract_holds():
    lint = Path(sys.executable).parent / "lint-imports"
    res = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "1 kept, 0 broken" in res.stdout


def test_no_package_import_inside_a_function_without_its_reason():
    hidden = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        inner = {id(x) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for x in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) in inner and (node.module or "").startswith("clusterft"):
                if "#" not in lines[node.lineno - 1]:  # a comment on the import line says why
                    hidden.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert hidden == []


def test_functions_stay_short_and_long_modules_say_why():
    long_functions, long_modules = [], []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > 60:
                long_functions.append(f"{path.relative_to(REPO)}:{f.name}")
        doc = " ".join((ast.get_docstring(tree) or "").split())
        if len(path.read_text().splitlines()) > 320 and "Long because" not in doc:
            long_modules.append(str(path.relative_to(REPO)))
    assert long_functions == [] and long_modules == []


def test_importing_the_package_changes_nothing_in_the_callers_process():
    code = ("import json, os, torch, transformers, peft, mlflow, prefect  # their own import-time settings\n"
            "before = dict(os.environ)\n"
            "import clusterft, clusterft.integrations, clusterft.cli, clusterft.orchestration.experiment\n"
            "print(json.dumps(sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "TOKENIZERS_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert json.loads(out.stdout) == []


def test_ruff_finds_no_unused_or_undefined_names():
    ruff = Path(sys.executable).parent / "ruff"
    res = subprocess.run([str(ruff), "check", "src", "tests", "benchmarks", "flows"], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:]

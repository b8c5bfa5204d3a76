"""The DVC files, generated from the stage table: `dvc.yaml` (the quick-start pipeline) and
`experiments/dvc.yaml` (the grid). Each stage's code deps are derived, not written: the
source files its module imports, transitively, so `dvc repro` reruns every stage a code
change can touch (editing the loss reruns train and evaluate)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import yaml

import clusterft
from clusterft.spec.stages import STAGES, Stage

PACKAGE = Path(clusterft.__file__).resolve().parent
SRC = "src/clusterft"  # where the package sits in the project (the DVC deps' prefix)


def _module_file(name: str) -> Path | None:
    """The source file of package module `name` (clusterft.a.b), or None when it is not one."""
    parts = name.split(".")[1:]
    candidates = [PACKAGE / Path(*parts[:-1]) / f"{parts[-1]}.py"] if parts else []
    for p in (*candidates, PACKAGE.joinpath(*parts, "__init__.py")):
        if p.is_file():
            return p
    return None


def _imports(path: Path) -> set[str]:
    """Package modules a source file imports, wherever the import statement stands."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        out |= {n for n in names if n.split(".")[0] == "clusterft" and _module_file(n)}
    return out


def module_closure(module: str) -> list[Path]:
    """Source files that importing `module` runs: it, its package __init__ files, and the
    same for everything it imports, transitively; sorted."""
    todo, seen = [module], set()
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # the packages on the way in run their __init__
            prefix = ".".join(parts[:i])
            if prefix not in seen and _module_file(prefix):
                seen.add(prefix)
                todo.extend(_imports(_module_file(prefix)))
    return sorted({_module_file(n) for n in seen})


def code_deps(st: Stage) -> list[str]:
    """The stage's code deps as project paths: its module's closure (a stage that runs the
    other stages, the grid, also depends on theirs)."""
    modules = [st.func.split(":")[0]]
    if st.runs_stages:
        modules += [s.func.split(":")[0] for s in STAGES if s is not st]
    files = {f for m in modules for f in module_closure(f"clusterft.{m}")}
    return sorted(f"{SRC}/{f.relative_to(PACKAGE).as_posix()}" for f in files)


def dvc_stages(dvcfile: str = "dvc.yaml") -> dict[str, Any]:
    """The `stages:` mapping of one DVC file, built from STAGES."""
    up = "../" * dvcfile.count("/")  # paths in a nested dvc.yaml are relative to its folder

    def dvc_path(p: str) -> str:
        return p.replace("{art}", "${paths.artifacts}").replace("{run}", "${paths.artifacts}/methods/${item}")

    out: dict[str, Any] = {}
    for s in (x for x in STAGES if x.dvcfile == dvcfile):
        cmd = f"clusterft {s.name}" + (" --method ${item}" if s.per_method else "")
        body: dict[str, Any] = {"cmd": cmd}
        if up:
            body["wdir"] = up.rstrip("/")
        body["deps"] = code_deps(s) + [dvc_path(d) for d in s.deps]
        body["params"] = list(s.params)
        outs = [dvc_path(o) for o in s.outs] + [{dvc_path(o): {"cache": False}} for o in s.uncached]
        if outs:
            body["outs"] = outs
        body["metrics"] = [{dvc_path(m): {"cache": False}} for m in s.metrics]
        if s.plots:
            body["plots"] = [{dvc_path(p): {"cache": False}} for p in s.plots]
        out[s.name] = {"foreach": "${select.methods}", "do": body} if s.per_method else body
    return out


HEADER = {
    "dvc.yaml": "# clusterft pipeline: `dvc repro` runs every stage for each method in select.methods and\n"
                "# writes artifacts/report/compare.md. Generated from src/clusterft/spec/stages.py by\n"
                "# `clusterft dvc-yaml` (code deps derived from each stage's imports): edit the table, not this file.\n",
    "experiments/dvc.yaml": "# The headline experiment (methods x budgets x seeds), kept apart from the quick-start\n"
                            "# pipeline because it trains dozens of models: `dvc repro experiments/dvc.yaml`.\n"
                            "# Generated from src/clusterft/spec/stages.py by `clusterft dvc-yaml`.\n",
}


def dvc_yaml(dvcfile: str = "dvc.yaml") -> str:
    """The text of a generated DVC file."""
    doc: dict[str, Any] = {}
    if dvcfile != "dvc.yaml":
        doc["vars"] = ["../" * dvcfile.count("/") + "params.yaml"]
    doc["stages"] = dvc_stages(dvcfile)
    return HEADER[dvcfile] + yaml.safe_dump(doc, sort_keys=False, width=120)


def write_dvc_files(root: str | Path = ".", check: bool = False) -> list[str]:
    """Write (or with `check`, only compare) every generated DVC file; return the stale ones."""
    stale = []
    for name in HEADER:
        path, text = Path(root) / name, dvc_yaml(name)
        if not path.exists() or path.read_text() != text:
            stale.append(name)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return stale

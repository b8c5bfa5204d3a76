"""Prefect flows over the DVC pipeline: one task per DVC stage (per method for per-method
stages), each `dvc repro --single-item <stage>`, so DVC's lock and cache decide what is up
to date, whichever entry point ran last. Training and features run under torchrun as under
`dvc repro`; each stage's output lines go to the Prefect log; the comparison table is a
Prefect markdown artifact. A stage that failed on bad input or params (clusterft exits 2)
is not retried; anything else is, twice. A flow holds the artifacts folder's lock while it
runs (clusterft.io.runlock), so a second pipeline on the same folder is refused at once.

    python flows/pipeline.py [PROJECT]        # the quick-start pipeline (dvc.yaml)
    python flows/pipeline.py [PROJECT] --experiment   # the grid (experiments/dvc.yaml)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from clusterft.io.preflight import load_checked
from clusterft.io.runlock import artifacts_lock
from clusterft.orchestration.dvcfile import write_dvc_files
from clusterft.spec.stages import PIPELINE


class StageFailed(RuntimeError):
    """`dvc repro` of one stage failed; `deterministic` when clusterft refused its input."""

    def __init__(self, target: str, code: int, tail: str):
        self.deterministic = ", exited with 2" in tail or "clusterft " in tail and ": error:" in tail
        super().__init__(f"dvc repro {target} exited with {code}:\n{tail}")


def _transient(task: Any, run: Any, state: Any) -> bool:
    """Retry condition: not after bad input or params (it would fail the same way again)."""
    return not getattr(state.data, "deterministic", False)


def _env() -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "DVC_NO_ANALYTICS": "1"}


def dvc(project: str | Path, *args: str, log: Any = None) -> str:
    """Run `dvc args` in `project` with this interpreter's scripts on PATH; stream the lines
    to `log`; return the output; raise StageFailed on a non-zero exit."""
    proc = subprocess.Popen([sys.executable, "-m", "dvc", *args], cwd=project, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if log is not None:
            log.info(line.rstrip())
    if proc.wait() != 0:
        raise StageFailed(" ".join(args), proc.returncode, "".join(lines[-40:]))
    return "".join(lines)


@task(name="stage", retries=2, retry_delay_seconds=10, retry_condition_fn=_transient)
def repro(project: str, target: str, single: bool = True) -> str:
    """Reproduce one DVC stage; `single`: only it (its upstream ran as earlier tasks)."""
    return dvc(project, "repro", *(["--single-item"] if single else []), target, log=get_run_logger())


def up_to_date(project: str) -> bool:
    """`dvc status`: nothing in dvc.yaml changed since it last ran (one call, seconds). Only
    stdout is JSON: DVC's warnings (e.g. after a killed run) go to the log."""
    res = subprocess.run([sys.executable, "-m", "dvc", "status", "--json", "dvc.yaml"], cwd=project,
                         env=_env(), capture_output=True, text=True)
    if res.stderr.strip():
        get_run_logger().warning(res.stderr.strip())
    if res.returncode != 0:
        raise StageFailed("status", res.returncode, res.stdout[-4000:] + res.stderr[-4000:])
    return json.loads(res.stdout or "{}") == {}


def _prepare(project: str) -> Any:
    """Check params and that the DVC files match the stage table before any stage runs."""
    cfg = load_checked(Path(project) / "params.yaml")
    stale = write_dvc_files(project, check=True)
    if stale:
        raise RuntimeError(f"{', '.join(stale)} in {project} differ from the stage table; "
                           "run `clusterft dvc-yaml` there")
    return cfg


def _publish(path: Path, key: str, description: str) -> str:
    text = path.read_text() if path.exists() else "(no report)"
    create_markdown_artifact(markdown=text, key=key, description=description)
    return text


@flow(name="clusterft-pipeline", log_prints=True)
def pipeline(project: str = ".") -> dict[str, Any]:
    """Every stage of dvc.yaml in order, as its own task; then the comparison artifact."""
    cfg = _prepare(project)
    with artifacts_lock(Path(project) / cfg.paths.artifacts, "Prefect flow clusterft-pipeline"):
        if up_to_date(project):
            get_run_logger().info("dvc status: every stage is up to date; nothing to run")
        else:
            for st in PIPELINE:
                for target in ([f"{st.name}@{m}" for m in cfg.select.methods] if st.per_method else [st.name]):
                    repro.with_options(name=target)(project, target)
    art = Path(project) / cfg.paths.artifacts / "report"
    table = _publish(art / "compare.md", "clusterft-compare", "time and accuracy per method")
    return {**json.loads((art / "compare.json").read_text()), "markdown": table}


@flow(name="clusterft-experiment", log_prints=True)
def experiment(project: str = ".") -> dict[str, Any]:
    """The experiment grid stage (experiments/dvc.yaml, upstream stages first)."""
    cfg = _prepare(project)
    with artifacts_lock(Path(project) / cfg.paths.artifacts, "Prefect flow clusterft-experiment"):
        repro.with_options(name="experiment")(project, "experiments/dvc.yaml:experiment", single=False)
    out = Path(project) / cfg.paths.artifacts / "experiments"
    table = _publish(out / "report.md", "clusterft-experiment", "methods x budgets x seeds")
    return {**json.loads((out / "results.json").read_text()), "markdown": table}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    (experiment if "--experiment" in sys.argv else pipeline)(args[0] if args else ".")

"""Experiment grid: methods x budgets x seeds, each a full select -> allocate -> train ->
evaluate run in experiments/<run>/, then one report (markdown + PNG + MLflow).

The selection stages every cluster-based run needs (warmup, features, cluster) are run
once, through the same launcher as `dvc repro` (so their measured time is the declared
launch's), and their wall-clock is added to each such run's end-to-end time, as a user would
pay it once per dataset. `full` and `infobatch` ignore the budget; `cluster_paper` uses the
budget as the paper's ratio r (its kept fraction then follows the smallest cluster).

The runs go one after the other in this process, or with experiment.work_pool each as a
flow run of `grid_run` that a worker of that Prefect work pool takes (orchestration.pool):
the same run_one on a machine that shares the project folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import Failed
from tqdm import tqdm

from clusterft.core.timebudget import TimeModel
from clusterft.errors import USER_ERRORS, GridRunError, SelectionError
from clusterft.io.artifacts import atomic_write_text, ensure_dir
from clusterft.io.runlock import artifacts_lock
from clusterft.io.timings import SHARED_TIMES, read_probe, write_shared_times
from clusterft.orchestration.launch import run_stage
from clusterft.orchestration.pool import BAD_INPUT, check_ready, run_on_pool
from clusterft.report.grid import result_row, write_report
from clusterft.report.tracking import run_params
from clusterft.runtime.data import load_examples
from clusterft.spec.config import load_config, to_dict
from clusterft.spec.grid import RunSpec, grid
from clusterft.spec.methods import METHODS, paid_stages, time_budgeted
from clusterft.spec.stages import LATER_KEYS, PIPELINE, STAGES
from clusterft.stages.evaluate import run_zero_shot
from clusterft.stages.timeplan import cluster_count, time_plan, train_chars

log = logging.getLogger(__name__)

SHARED_SECTIONS = ("data", "model", "lora", "warmup", "features", "cluster")
RUN_SECTIONS = (*SHARED_SECTIONS, "select", "train", "evaluate")


TIME_BUDGET_KEYS = ("select.time_budget", "select.probe_steps")


def params_digest(cfg: Any, sections: tuple[str, ...], omit: tuple[str, ...] = ()) -> str:
    """Hash of the effective params of `sections` (less the `omit` keys) and of the data
    files they name: equal digests mean a stored result was made from the same inputs."""
    doc = {s: to_dict(getattr(cfg, s)) for s in sections}
    for key in omit:
        section, name = key.split(".")
        doc.get(section, {}).pop(name, None)
    h = hashlib.sha1(json.dumps(doc, sort_keys=True).encode())
    for split in ("train", "validation", "test"):
        p = Path(getattr(cfg.data, split))
        h.update(p.read_bytes() if p.exists() else b"-")
    return h.hexdigest()


def run_digest(cfg: Any, spec: RunSpec) -> str:
    """A run's digest: its params and data, and for a time-budgeted run the probe's timings
    its data budget was planned from (a new probe reruns it). Without a time budget its
    params are left out, so runs made before they existed stay valid (as LATER_KEYS at their
    old value)."""
    later = tuple(k for k, v in LATER_KEYS.items() if cfg.value(k) == v)
    digest = params_digest(cfg, RUN_SECTIONS, (*later, *(() if spec.time_budget else TIME_BUDGET_KEYS)))
    probe = cfg.artifact("probe", "metrics.json")
    if spec.time_budget and probe.exists():
        digest = hashlib.sha1(digest.encode() + probe.read_bytes()).hexdigest()
    return digest


def _fresh(stamp: Path, digest: str, done: Path) -> bool:
    """True when `done` exists and `stamp` says it was made under `digest`."""
    return done.exists() and stamp.exists() and stamp.read_text().strip() == digest


def result_files(cfg: Any, spec: RunSpec) -> list[Path]:
    """A finished run's result files, what its report row is read from (no weights): its
    digest, params, the shared stages' seconds it paid and the metrics of its per-run stages."""
    rdir = cfg.method_dir(spec.method, spec.name)
    return [rdir / "digest.txt", rdir / "params.json", rdir / SHARED_TIMES,
            *(st.metrics_path(cfg, spec.method, spec.name) for st in PIPELINE if st.per_method)]


def kept_run(cfg: Any, spec: RunSpec, digest: str) -> Path | None:
    """experiment.results_dir/<run>/ when it holds every result file of the run made under
    `digest` (the same params and data), else None."""
    if not cfg.experiment.results_dir:
        return None
    kept = Path(cfg.experiment.results_dir) / spec.name
    whole = all((kept / f.name).exists() for f in result_files(cfg, spec))
    return kept if whole and _fresh(kept / "digest.txt", digest, kept / "digest.txt") else None


def keep_results(cfg: Any, spec: RunSpec, digest: str) -> None:
    """Copy a finished run's result files to experiment.results_dir/<run>/ (when set and not
    kept there under `digest` yet), whole or not at all, so a grid can finish over several
    machines or sessions."""
    if not cfg.experiment.results_dir or kept_run(cfg, spec, digest) is not None:
        return
    dest = Path(cfg.experiment.results_dir) / spec.name
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    ensure_dir(tmp)
    for f in result_files(cfg, spec):
        shutil.copy2(f, tmp / f.name)
    if (dest / "digest.txt").exists():  # kept under other params or data: say so, it is replaced
        log.warning("%s: replacing a run kept under other params or data", dest)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def restore_results(cfg: Any, spec: RunSpec, digest: str) -> bool:
    """Bring a run kept whole under `digest` in experiment.results_dir into its run folder (a
    part-way run there, checkpoints too, is replaced: the kept one is done); True when it did.
    Only under the run's lock (run_one): the report reads kept runs where they are."""
    kept = kept_run(cfg, spec, digest)
    if kept is None:
        return False
    rdir = cfg.method_dir(spec.method, spec.name)
    shutil.rmtree(rdir, ignore_errors=True)
    ensure_dir(rdir)
    files = result_files(cfg, spec)
    for f in files[1:]:
        shutil.copy2(kept / f.name, f)
    shutil.copy2(kept / "digest.txt", files[0])  # last: the stamp says the folder is whole
    return True


def run_one(params: str, overrides: list[str], spec: RunSpec) -> dict[str, Any]:
    """Select, allocate, train (torchrun) and evaluate one run; return its result row.
    A finished run is reused only when its params and data digest match (from its folder, or
    from experiment.results_dir); a run stopped part-way under the same digest goes on
    (training resumes from its last checkpoint); a run folder made under other params is
    cleared first (its checkpoints too). A finished run's result files go to results_dir."""
    cfg = load_config(params, [*overrides, *spec.overrides()])
    rdir = cfg.method_dir(spec.method, spec.name)
    digest = run_digest(cfg, spec)
    stamp = rdir / "digest.txt"  # the digest the folder's outputs are made under
    if not _fresh(stamp, digest, rdir / "eval.json") and not restore_results(cfg, spec, digest):
        if rdir.exists() and not _fresh(stamp, digest, stamp):
            shutil.rmtree(rdir)
        atomic_write_text(ensure_dir(rdir) / "digest.txt", digest)
        for st in PIPELINE:
            if st.per_method:
                run_stage(cfg, st.name, params, [*overrides, *spec.overrides()], spec.method, spec.name)
        atomic_write_text(rdir / "params.json", json.dumps(run_params(cfg), indent=1))
    if not (rdir / SHARED_TIMES).exists():  # the selection seconds this run paid, fixed with it
        write_shared_times(cfg, rdir)
    keep_results(cfg, spec, digest)
    return result_row(cfg, spec, rdir)


@flow(name="clusterft-grid-run", persist_result=False)
def grid_run(params: str, overrides: list[str], method: str, budget: float | None, seed: int,
             time_budget: float | None = None) -> Any:
    """One grid run as a work pool's flow run: run_one while holding the run's own lock (an
    earlier attempt still running on a lost worker's machine is waited for, not doubled).
    Bad params or data end it in the BAD_INPUT state, which the grid never resubmits."""
    spec = RunSpec(method, budget, seed, time_budget)
    try:
        cfg = load_config(params, [*overrides, *spec.overrides()])
        with artifacts_lock(cfg.artifact("experiments", ".locks", spec.name), f"grid run {spec.name}", wait=True):
            run_one(params, overrides, spec)
    except USER_ERRORS as exc:
        return Failed(name=BAD_INPUT, message=f"{spec.name}: {type(exc).__name__}: {exc}")
    return spec.name


def finished_row(params: str, overrides: list[str], spec: RunSpec) -> dict[str, Any] | None:
    """The result row of a run finished under the current params (in its folder or kept in
    experiment.results_dir), else None."""
    cfg = load_config(params, [*overrides, *spec.overrides()])
    rdir = cfg.method_dir(spec.method, spec.name)
    digest = run_digest(cfg, spec)
    if _fresh(rdir / "digest.txt", digest, rdir / "eval.json"):
        return result_row(cfg, spec, rdir)
    kept = kept_run(cfg, spec, digest)
    return result_row(cfg, spec, kept) if kept is not None else None


def prepare_shared(cfg: Any, params: str, overrides: list[str]) -> None:
    """Run the once-per-dataset stages the grid's methods need, unless already done under
    the same params and data (else all of them again); the training probe (torchrun) when
    a time budget needs it and its last run timed another setup."""
    digest = params_digest(cfg, SHARED_SECTIONS)
    stamp = cfg.artifact("shared_digest.txt")  # written once every shared stage is done
    stale = not _fresh(stamp, digest, stamp)
    e = cfg.experiment
    needed = {"prepare-model"} | {s for m in e.methods for tb in (0, *e.time_budgets) for s in paid_stages(m, tb)}
    if cfg.builtin_split("train"):
        needed.add("make-benchmark")
    for st in STAGES:
        if st.name == "probe" and st.name in needed:
            _probe(params, [*overrides, f"select.time_budget={e.time_budgets[0]}"])
        elif st.name in needed and (stale or not st.metrics_path(cfg).exists()):
            run_stage(cfg, st.name, params, overrides)  # the launch dvc repro uses (features: its workers)
    if cfg.experiment.zero_shot and (stale or not cfg.artifact("baseline", "eval.json").exists()):
        run_zero_shot(cfg)  # the floor: the base model before any fine-tuning
    atomic_write_text(stamp, params_digest(cfg, SHARED_SECTIONS))  # with the data make-benchmark may have just written


def check_time_budgets(params: str, overrides: list[str]) -> None:
    """Refuse (TimeBudgetError, with the smallest that fits) a time budget of the grid that no
    run could meet, before any run trains (each run's select would refuse it later)."""
    base = load_config(params, overrides)
    if not base.experiment.time_budgets:
        return
    chars, tm = train_chars(load_examples(base, "train")), TimeModel.from_probe(read_probe(base))
    for tb in base.experiment.time_budgets:
        cfg = load_config(params, [*overrides, f"select.time_budget={tb}"])
        for m in base.experiment.methods:
            if time_budgeted(m, tb):
                time_plan(cfg, m, tm, chars, cluster_count(cfg) if "cluster" in METHODS[m].needs else 0, 0.0)


def _probe(params: str, overrides: list[str]) -> None:
    """Run the probe stage (torchrun) unless it already timed this training setup."""
    on = load_config(params, overrides)
    try:
        read_probe(on)
    except SelectionError:
        run_stage(on, "probe", params, overrides)


def run_experiment(params: str, overrides: list[str] | None = None, progress: bool = True,
                   report_only: bool = False) -> dict[str, Any]:
    """Stage `experiment`: shared stages once (if missing), every grid run, the report.
    `report_only`: no training; the report covers the grid's runs already finished under the
    current params (e.g. a grid stopped part-way)."""
    overrides = list(overrides or [])
    cfg = load_config(params, overrides)
    e = cfg.experiment
    specs = grid(e.methods, e.budgets, e.seeds, e.time_budgets)
    if report_only:
        rows = [r for r in (finished_row(params, overrides, s) for s in specs) if r is not None]
        return write_report(cfg, rows)
    if e.work_pool:
        check_ready(e)  # an unknown pool, or one with no worker, is refused before any stage runs
    prepare_shared(cfg, params, overrides)
    check_time_budgets(params, overrides)
    start = time.perf_counter()
    if e.work_pool:
        rows = _on_pool(cfg, params, overrides, specs, progress)
    else:
        rows = []
        bar = tqdm(specs, desc="experiment", unit="run", disable=not progress)
        for spec in bar:
            bar.set_postfix_str(spec.name)
            rows.append(run_one(params, overrides, spec))
    summary = write_report(cfg, rows)
    summary["wall_clock_s"] = time.perf_counter() - start
    return summary


def _on_pool(cfg: Any, params: str, overrides: list[str], specs: list[RunSpec], progress: bool) -> list[dict]:
    """The grid's rows, its unfinished runs submitted to experiment.work_pool (paths as this
    process sees them: the workers run in its folder, shared across machines)."""
    done = {s.name: finished_row(params, overrides, s) for s in specs}
    absolute = str(Path(params).resolve())
    jobs = {s.name: {"params": absolute, "overrides": overrides, "method": s.method, "budget": s.budget,
                     "seed": s.seed, "time_budget": s.time_budget} for s in specs if done[s.name] is None}
    by_name = {s.name: s for s in specs}

    def collect(name: str) -> dict:
        row = finished_row(params, overrides, by_name[name])
        if row is None:
            raise GridRunError(f"grid run {name} completed on the pool but {cfg.method_dir(by_name[name].method, name)} "
                               "holds no result under the current params: do the workers share this folder?")
        return row

    ran = run_on_pool(cfg.experiment, grid_run, jobs, collect, str(Path.cwd()), progress) if jobs else {}
    return [done[s.name] or ran[s.name] for s in specs]

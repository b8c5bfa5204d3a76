"""The experiment grid on a Prefect work pool: each grid run is a flow run of one deployment,
and any worker of the pool takes it (a worker per machine, or per GPU set of a machine).

This process checks the pool before anything is submitted (it exists, a worker is alive),
submits the runs, follows them, and submits a run again when its worker was lost (no
heartbeat for LOST_AFTER intervals, Prefect's own offline rule: a dead machine takes its
run with it, and nothing on the server notices) or when it failed on a fault, up to
experiment.attempts times. A run refused for bad input (BAD_INPUT) is not submitted again.
Results are read from the project folder the workers share, as the in-process grid reads
them. Reference: docs.prefect.io, "Work pools" and "Deploy flows".
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.exceptions import ObjectNotFound
from prefect.settings import get_current_settings
from prefect.states import Crashed
from prefect.types.entrypoint import EntrypointType
from tqdm import tqdm

from clusterft.errors import GridInputError, GridRunError, WorkPoolError

log = logging.getLogger(__name__)

BAD_INPUT = "BadInput"  # the state name of a grid run refused for its params or data
LOST_AFTER = 3  # missed heartbeats after which a worker is lost (Prefect's own rule)
POLL_S = 2.0


def _start_worker_hint(pool: str) -> str:
    return f"start one on each machine: prefect worker start --pool {pool} --type process --limit 1"


def api_url() -> str:
    """The Prefect server the workers share; refused when unset (Prefect would otherwise start
    a temporary server of this process's own, which no worker can reach)."""
    url = get_current_settings().api.url
    if not url:
        raise WorkPoolError("experiment.work_pool: PREFECT_API_URL is not set; point it at the Prefect "
                            "server the pool's workers use (e.g. http://127.0.0.1:4200/api)")
    return url


def live_workers(client: SyncPrefectClient, pool: str) -> list[str]:
    """Names of the pool's workers whose last heartbeat is recent (LOST_AFTER intervals)."""
    now = datetime.now(timezone.utc)
    return sorted(w.name for w in client.read_workers_for_work_pool(pool)
                  if w.last_heartbeat_time is not None
                  and (now - w.last_heartbeat_time).total_seconds()
                  <= LOST_AFTER * (w.heartbeat_interval_seconds or 30))


def check_pool(client: SyncPrefectClient, e: Any, url: str) -> list[str]:
    """The live workers of pool e.work_pool, after waiting up to e.worker_timeout for one;
    WorkPoolError naming the pool when it does not exist or none comes."""
    pool = e.work_pool
    try:
        client.read_work_pool(pool)
    except ObjectNotFound:
        raise WorkPoolError(f"experiment.work_pool: no work pool {pool!r} on the Prefect server {url}; create "
                            f"it (prefect work-pool create {pool} --type process) and {_start_worker_hint(pool)}"
                            ) from None
    deadline = time.monotonic() + e.worker_timeout
    while not (live := live_workers(client, pool)):
        if time.monotonic() > deadline:
            raise WorkPoolError(f"experiment.work_pool: work pool {pool!r} has no live worker after "
                                f"{e.worker_timeout:g} s (experiment.worker_timeout); {_start_worker_hint(pool)}")
        time.sleep(1.0)
    return live


@dataclass
class Attempt:
    """One submission of a grid run: its flow run and its number (1 = first)."""

    flow_run_id: UUID
    number: int


def check_ready(e: Any) -> list[str]:
    """Before any work: the server answers, pool e.work_pool exists and has a live worker
    (waiting up to e.worker_timeout); its live workers. WorkPoolError otherwise."""
    url = api_url()
    with get_client(sync_client=True) as client:
        try:
            client.api_healthcheck()
        except Exception as exc:  # noqa: BLE001 - any transport error: the server is not there
            raise WorkPoolError(f"experiment.work_pool: cannot reach the Prefect server {url} ({exc})") from None
        return check_pool(client, e, url)


def run_on_pool(e: Any, grid_flow: Any, jobs: dict[str, dict[str, Any]], collect: Callable[[str], dict],
                working_dir: str, progress: bool = True) -> dict[str, dict]:
    """Run `jobs` (grid run name -> `grid_flow` parameters) on pool e.work_pool; return each
    run's result row (`collect(name)` once its flow run completed). After every other run
    has finished, raises GridInputError listing the runs refused for bad input, else
    GridRunError listing those that failed on every attempt."""
    workers = check_ready(e)
    log.info("work pool %s: live workers %s; %d grid runs to submit", e.work_pool, ", ".join(workers), len(jobs))
    deployment = grid_flow.deploy(name=e.work_pool, work_pool_name=e.work_pool,
                                  entrypoint_type=EntrypointType.MODULE_PATH,
                                  job_variables={"working_dir": working_dir},
                                  print_next_steps=False, ignore_warnings=True)
    with get_client(sync_client=True) as client:
        return _follow(client, e, deployment, jobs, collect, progress)


def _follow(client: SyncPrefectClient, e: Any, deployment: UUID, jobs: dict[str, dict[str, Any]],
            collect: Callable[[str], dict], progress: bool) -> dict[str, dict]:
    grid = uuid.uuid4().hex[:8]  # idempotency keys of this grid's submissions

    def submit(name: str, number: int) -> Attempt:
        fr = client.create_flow_run_from_deployment(deployment, parameters=jobs[name], name=f"{name}-a{number}",
                                                    idempotency_key=f"{grid}-{name}-a{number}")
        return Attempt(fr.id, number)

    active = {name: submit(name, 1) for name in jobs}
    rows: dict[str, dict] = {}
    failed: dict[str, str] = {}  # faults, every attempt spent
    refused: dict[str, str] = {}  # bad input
    no_worker_since: float | None = None
    bar = tqdm(total=len(jobs), desc=f"experiment on {e.work_pool}", unit="run", disable=not progress)
    while active:
        time.sleep(POLL_S)
        live = set(live_workers(client, e.work_pool))
        no_worker_since = None if live else (no_worker_since or time.monotonic())
        if no_worker_since is not None and time.monotonic() - no_worker_since > e.worker_timeout:
            raise WorkPoolError(f"experiment.work_pool: work pool {e.work_pool!r} has had no live worker for "
                                f"{e.worker_timeout:g} s with {len(active)} grid runs left ({', '.join(active)}); "
                                f"{_start_worker_hint(e.work_pool)}, then rerun: finished runs are reused")
        running = []
        for name, at in list(active.items()):
            fr = client.read_flow_run(at.flow_run_id)
            state, worker = fr.state, (fr.labels or {}).get("prefect.worker.name")
            if state is None:
                continue
            lost = bool(worker) and worker not in live and (state.is_running() or state.is_pending())
            if not (state.is_final() or lost):  # still queued or running on a live worker
                if worker and state.is_running():
                    running.append(f"{name}@{worker}")
                continue
            if state.is_completed():
                rows[name] = collect(name)
            elif state.is_failed() and state.name == BAD_INPUT:
                refused[name] = state.message or ""
            else:  # a fault or a lost worker: again, while attempts are left
                why = f"worker {worker} lost (no heartbeat)" if lost else f"{state.name}: {state.message}"
                if lost:
                    client.set_flow_run_state(at.flow_run_id, Crashed(message=why), force=True)
                if at.number < e.attempts:
                    log.warning("grid run %s, attempt %d: %s; submitting it again", name, at.number, why)
                    active[name] = submit(name, at.number + 1)
                    continue
                failed[name] = f"attempt {at.number} of {e.attempts}: {why}"
            del active[name]  # finished for good: done, refused or out of attempts
            bar.update(1)
        bar.set_postfix_str(", ".join(running))
    bar.close()
    kept = "the others finished and a rerun reuses them"
    if refused:
        raise GridInputError(f"grid runs refused for bad params or data, not retried ({kept}): "
                             + "; ".join(refused.values()))
    if failed:
        raise GridRunError(f"grid runs failed on work pool {e.work_pool!r} ({kept}): "
                           + "; ".join(f"{n}: {m}" for n, m in failed.items()))
    return rows

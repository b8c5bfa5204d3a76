"""Serve the pipeline flow as a Prefect deployment on a cron schedule (nightly by default).

    prefect server start --host 127.0.0.1 --port 4200          # terminal 1: local server
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python flows/deploy.py --project .                          # terminal 2: 02:00 every night
    prefect deployment run clusterft-pipeline/nightly           # or trigger a run now

This process registers the deployment, then polls the server and runs each due flow run
in a subprocess of its own. Each run reproduces the project's DVC stages (the same lock
and cache as `dvc repro`), so a run after no change finishes in seconds. Ctrl-C or SIGTERM
stops it and pauses the schedule. Runs never overlap (limit 1): they share the project.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `flows` importable as a script

NIGHTLY = "0 2 * * *"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", default="nightly", help="deployment name (default nightly)")
    p.add_argument("--cron", default=NIGHTLY, help=f"cron schedule, server time zone (default {NIGHTLY!r})")
    p.add_argument("--project", default=".", help="DVC project the runs reproduce (default: this folder)")
    return p


def main(argv: list[str] | None = None) -> int:
    from clusterft.errors import ConfigError
    from clusterft.io.preflight import load_checked

    args = build_parser().parse_args(argv)
    project = str(Path(args.project).resolve())
    try:  # fail now, not at 02:00
        load_checked(Path(project) / "params.yaml")
    except ConfigError as exc:
        print(f"deploy: error: {exc}", file=sys.stderr)
        return 2
    from flows.pipeline import pipeline

    pipeline.serve(
        name=args.name,
        cron=args.cron,
        parameters={"project": project},
        description="clusterft pipeline (dvc.yaml stages) on a schedule",
        limit=1,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

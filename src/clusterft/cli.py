"""`clusterft` command line: one subcommand per stage, all reading params.yaml.

Every subcommand takes `--params FILE` and any number of `--set section.key=value`
overrides. Stages with a method (`select`, `allocate`, `train`, `evaluate`) take
`--method`. Stages with workers (`features`, `probe`, `train`) re-launch themselves under
torchrun when they run more than one process.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import warnings
from typing import Any

from clusterft.methods import METHODS
from clusterft.stages import BY_NAME, STAGES

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clusterft", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for st in STAGES:
        sp = sub.add_parser(st.name, help=st.help, description=st.help)
        sp.add_argument("--params", default="params.yaml", help="params file (default params.yaml)")
        sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a param, e.g. --set select.budget=0.3")
        if st.per_method:
            sp.add_argument("--method", required=True, help=f"selection method: {', '.join(METHODS)}")
            sp.add_argument("--run-name", dest="run", default=None,
                            help="named run folder (experiments/<name>) instead of methods/<method>")
        if st.name == "experiment":
            sp.add_argument("--report-only", action="store_true",
                            help="train nothing: report the runs already finished under the current params")
    sub.add_parser("params", help="print every param with its default and help")
    sp = sub.add_parser("dvc-yaml", help="write dvc.yaml and experiments/dvc.yaml from the stage table",
                        description="Generate the DVC files from src/clusterft/stages.py.")
    sp.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    return p


def print_params() -> None:
    from clusterft.config import PipelineConfig

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(default):
                walk(type(default), f"{prefix}{f.name}.")
            else:
                print(f"{prefix}{f.name} = {default!r}  # {f.metadata.get('help', '')}")

    walk(PipelineConfig, "")


def _under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def _run_stage(cfg: Any, st: Any, args: argparse.Namespace) -> None:
    """One stage in this process, or relaunched under torchrun when it has several workers."""
    if st.name == "experiment":
        from clusterft.experiment import run_experiment

        run_experiment(args.params, args.overrides, report_only=args.report_only)
        return
    if st.nproc(cfg) > 1 and not _under_torchrun():  # re-run this same command under torchrun
        from clusterft.distributed import launch_stage

        launch_stage(cfg, st.name, args.params, args.overrides, args.method if st.per_method else None,
                     args.run if st.per_method else None)
        return
    st.function(cfg, args.method, args.run) if st.per_method else st.function(cfg)


def main(argv: list[str] | None = None) -> int:
    from clusterft.distributed import LaunchError
    from clusterft.errors import USER_ERRORS

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a hard dependency
        pass
    args = build_parser().parse_args(argv)
    if args.command == "params":
        print_params()
        return 0
    if args.command == "dvc-yaml":
        from clusterft.stages import write_dvc_files

        stale = write_dvc_files(".", check=args.check)
        for name in stale:
            print(f"{name}: {'differs from the stage table' if args.check else 'written'}")
        return 1 if args.check and stale else 0
    try:
        from clusterft.config import load_config

        from clusterft.runlock import artifacts_lock

        cfg = load_config(args.params, args.overrides)
        st = BY_NAME[args.command]
        if st.per_method:
            cfg.method_dir(args.method, args.run)  # an unknown method or a path as run name: refused now
        with artifacts_lock(cfg.artifact(), "clusterft " + " ".join(argv if argv is not None else sys.argv[1:])):
            _run_stage(cfg, st, args)
    except USER_ERRORS as exc:
        print(f"clusterft {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"clusterft {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`clusterft` command line: one subcommand per stage, all reading params.yaml.

Every subcommand takes `--params FILE` and any number of `--set section.key=value`
overrides. Stages with a method (`select`, `allocate`, `train`, `evaluate`) take
`--method`. Stages with workers (`features`, `probe`, `train`) re-launch themselves under
torchrun when they run more than one process.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from typing import Any

from clusterft.errors import USER_ERRORS, GridRunError, LaunchError
from clusterft.io.preflight import load_checked
from clusterft.io.runlock import artifacts_lock
from clusterft.orchestration.dvcfile import write_dvc_files
from clusterft.orchestration.launch import resolve, run_stage
from clusterft.spec.config import params_help, params_markdown
from clusterft.spec.methods import METHODS
from clusterft.spec.stages import BY_NAME, STAGES


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
    sp = sub.add_parser("params", help="print every param with its default and help")
    sp.add_argument("--markdown", action="store_true", help="as the README's markdown table")
    sp = sub.add_parser("dvc-yaml", help="write dvc.yaml and experiments/dvc.yaml from the stage table",
                        description="Generate the DVC files from src/clusterft/stages.py.")
    sp.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    return p


def print_params() -> None:
    for key, default, help_text in params_help():
        print(f"{key} = {default!r}  # {help_text}")


def _run_stage(cfg: Any, st: Any, args: argparse.Namespace) -> None:
    """One stage through the launcher (in this process, or under torchrun when it has several
    workers); the grid takes the params file itself."""
    if st.name == "experiment":
        resolve(st.func)(args.params, args.overrides, report_only=args.report_only)
        return
    method, run = (args.method, args.run) if st.per_method else (None, None)
    run_stage(cfg, st.name, args.params, args.overrides, method, run)


def main(argv: list[str] | None = None) -> int:
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
        print(params_markdown(), end="") if args.markdown else print_params()
        return 0
    if args.command == "dvc-yaml":
        stale = write_dvc_files(".", check=args.check)
        for name in stale:
            print(f"{name}: {'differs from the stage table' if args.check else 'written'}")
        return 1 if args.check and stale else 0
    try:
        cfg = load_checked(args.params, args.overrides)
        st = BY_NAME[args.command]
        if st.per_method:
            cfg.method_dir(args.method, args.run)  # an unknown method or a path as run name: refused now
        with artifacts_lock(cfg.artifact(), "clusterft " + " ".join(argv if argv is not None else sys.argv[1:])):
            _run_stage(cfg, st, args)
    except USER_ERRORS as exc:
        print(f"clusterft {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (LaunchError, GridRunError) as exc:
        print(f"clusterft {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`clusterft` command line: one subcommand per stage, all reading params.yaml.

Every subcommand takes `--params FILE` and any number of `--set section.key=value`
overrides. Stages with a method (`select`, `allocate`, `train`, `evaluate`) take
`--method`. `train` re-launches itself under torchrun when train.nproc > 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import warnings

STAGES_WITH_METHOD = ("select", "allocate", "train", "evaluate")


STAGE_HELP = {
    "make-benchmark": "write the built-in skill-mixture benchmark (train/validation/test JSONL)",
    "prepare-model": "build the built-in tiny model + tokenizer, or check model.path",
    "warmup": "short LoRA fine-tune on a random fraction of train",
    "features": "one gradient feature vector per train sample",
    "cluster": "k-means on the normalised features",
    "select": "choose the training subset and its per-sample weights",
    "allocate": "plan which sample each rank trains at each step",
    "train": "weighted data-parallel fine-tuning (torchrun)",
    "evaluate": "exact match per skill and held-out loss",
    "compare": "table of time and accuracy per method; MLflow runs",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clusterft", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in STAGE_HELP.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.add_argument("--params", default="params.yaml", help="params file (default params.yaml)")
        sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a param, e.g. --set select.budget=0.3")
        if name in STAGES_WITH_METHOD:
            sp.add_argument("--method", required=True, help="selection method, e.g. full or cluster")
            sp.add_argument("--run-name", dest="run", default=None,
                            help="named run folder (experiments/<name>) instead of methods/<method>")
    sp = sub.add_parser("experiment", help="methods x budgets x seeds grid and its report",
                        description="Run the experiment grid (params.yaml `experiment`) and write "
                                    "experiments/report.md + report.png; resumes finished runs.")
    sp.add_argument("--params", default="params.yaml")
    sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    sp.add_argument("--report-only", action="store_true",
                    help="train nothing: report the runs already finished under the current params")
    sp = sub.add_parser("params", help="print every param with its default and help")
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


def main(argv: list[str] | None = None) -> int:
    from clusterft.errors import USER_ERRORS
    from clusterft.stages import stage_functions

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
    try:
        from clusterft.config import load_config

        cfg = load_config(args.params, args.overrides)
        if args.command == "experiment":
            from clusterft.experiment import run_experiment

            run_experiment(args.params, args.overrides, report_only=args.report_only)
            return 0
        workers = {"features": cfg.features.nproc, "train": cfg.train.nproc}.get(args.command, 1)
        if workers > 1 and not _under_torchrun():  # re-run this same command under torchrun
            from clusterft.distributed import launch

            again = [args.command, "--params", args.params, *[a for o in args.overrides for a in ("--set", o)]]
            if args.command in STAGES_WITH_METHOD:
                again += ["--method", args.method] + (["--run-name", args.run] if args.run else [])
            launch(workers, again, max_restarts=cfg.train.max_restarts if args.command == "train" else 0)
            return 0
        fn = stage_functions()[args.command]
        fn(cfg, args.method, args.run) if args.command in STAGES_WITH_METHOD else fn(cfg)
    except USER_ERRORS as exc:
        print(f"clusterft {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

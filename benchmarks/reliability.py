"""The reliability table: every bad-input case and every injected fault, run through the
real tests, with what happened, whether the rerun reached the same result, and the time to
recover (the rerun, or the refusal). Prints a markdown table for BENCHMARKS.md.

    .venv/bin/python benchmarks/reliability.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_bad_input.py", "tests/runtime/test_checkpoint.py", "tests/io/test_runlock.py",
         "tests/stages/test_train_resume.py",
         "tests/test_faults.py"]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = Path(tmp) / "rows.jsonl"
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "slow or not slow", *TESTS],
                             cwd=REPO, env={**os.environ, "CLUSTERFT_RELIABILITY": str(rows_path)})
        rows = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else []
    faults = [r for r in rows if not r["case"].startswith("bad input")]
    bad = [r for r in rows if r["case"].startswith("bad input")]
    print(f"\n{len(bad)} bad inputs and params, {len(faults)} faults (tests passed: {res.returncode == 0})\n")
    print("| fault or bad input | what happened | resumed to the same result | time to recover s |")
    print("|---|---|---|---|")
    for r in faults + bad:
        print(f"| {r['case']} | {r['happened']} | {r['same_result']} | {r['recover_s']:.1f} |")
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())

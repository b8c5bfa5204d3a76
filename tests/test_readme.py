"""Every `clusterft` and `flows/deploy.py` command the README shows parses as written (the
runs themselves are covered by the tests and benchmarks named in the README)."""

import re
import shlex

import pytest

from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def _commands(prefix: str) -> list[str]:
    """Commands starting with `prefix`, from bash blocks and inline code."""
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    lines = [ln.split("  #")[0].strip() for b in blocks for ln in b.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"```.*?```", "", README, flags=re.S).replace("\n", " ")
    inline = [" ".join(c.split()) for c in re.findall(r"`([^`]+)`", prose)]
    return sorted({c for c in [*lines, *inline] if c.startswith(prefix)})


CLI = [c for c in _commands("clusterft ") if "<" not in c]  # no placeholders
DEPLOY = _commands("python flows/deploy.py")


def test_readme_shows_cli_and_deploy_commands():
    assert len(CLI) >= 5 and len(DEPLOY) >= 2


@pytest.mark.parametrize("command", CLI)
def test_readme_clusterft_command_parses(command):
    from clusterft.cli import build_parser

    args = shlex.split(command)[1:]
    build_parser().parse_args(args)  # SystemExit (exit 2) on anything the CLI would refuse


@pytest.mark.parametrize("command", DEPLOY)
def test_readme_deploy_command_parses(command):
    from flows.deploy import build_parser

    build_parser().parse_args(shlex.split(command)[2:])

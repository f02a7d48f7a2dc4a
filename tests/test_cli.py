"""The command line parses and dispatches."""
import subprocess
import sys

from reports.cli import SUBCOMMANDS, build_parser


def test_every_subcommand_is_wired():
    parser = build_parser()
    for name, _ in SUBCOMMANDS:
        args = parser.parse_args([name] + (["ops"] if name == "bench" else []))
        assert args.command == name


def test_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "reports", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for name, _ in SUBCOMMANDS:
        assert name in out.stdout

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


def test_a_reader_that_stops_early_gets_no_traceback():
    # `verigrad spec --list | head -1`: the reader has gone when the table (13 KB, more than
    # one buffer) is written; here it has gone before the first write, so the run is the same
    # every time
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "reports", "spec", "--list"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr

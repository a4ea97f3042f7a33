"""``python -m cubridge doctor [--json]`` and ``python -m cubridge inspect FILE [--json]``.

The same reports and exit codes as the C++ ``cubridge`` command (tools/exit_codes.hpp): 0 when
all is well, 1 for a problem found (a bad or unreadable image), 64 for a bad command line, 69
when there is no CUDA driver.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import _cubridge
from ._errors import DriverUnavailable, Error

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 64
EXIT_NO_DRIVER = 69


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cubridge", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"cubridge {_cubridge.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser("doctor", help="Devices, driver, runtime, loading mode, JIT cache and MPS")
    doctor.add_argument("--json", action="store_true", help="Print the report as JSON")
    inspect = commands.add_parser("inspect", help="What a cubin, fatbin or PTX file holds (no GPU needed)")
    inspect.add_argument("file", help="The image file")
    inspect.add_argument("--json", action="store_true", help="Print the result as JSON")
    return parser


def _doctor(as_json: bool) -> int:
    report_text = _cubridge.diagnose()
    report = json.loads(report_text)
    print(json.dumps(report, indent=2) if as_json else _cubridge.render_doctor(report_text), end="\n" if as_json else "")
    if not report["driver"]["available"]:
        print(f"cubridge: {report['driver']['reason']}", file=sys.stderr)
        return EXIT_NO_DRIVER
    return EXIT_OK


def _inspect(file: str, as_json: bool) -> int:
    info = _cubridge.inspect_file(file)
    if as_json:
        print(json.dumps(json.loads(info.to_json()), indent=2))
    else:
        print(_cubridge.render_image(info, file), end="")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns its exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as stop:  # argparse exits 2 for a bad command line; cubridge says 64
        return EXIT_OK if stop.code == 0 else EXIT_USAGE
    try:
        if args.command == "doctor":
            return _doctor(args.json)
        return _inspect(args.file, args.json)
    except DriverUnavailable as e:
        print(f"cubridge: {e}", file=sys.stderr)
        return EXIT_NO_DRIVER
    except Error as e:
        print(f"cubridge: {e}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())

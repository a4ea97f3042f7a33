"""``python -m cubridge doctor [--json]`` and ``python -m cubridge inspect FILE [--json] [--key KEY]``.

The same reports and exit codes as the C++ ``cubridge`` command (tools/exit_codes.hpp): 0 when
all is well, 1 for a problem found (a bad or unreadable image, a refused bundle), 64 for a bad
command line, 69 when there is no CUDA driver. Every other subcommand (keygen, sign, push, guard,
coldstart, fleet, ...) is the C++ tool's: this script, which an install puts on PATH as
``cubridge`` too, runs that tool with the same arguments when it is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import _cubridge
from ._errors import DriverUnavailable, Error

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 64
EXIT_NO_DRIVER = 69

# The subcommands implemented here; any other goes to the C++ tool.
OWN_COMMANDS = ("doctor", "inspect")
# Names the C++ tool, overriding the search of PATH.
TOOL_VARIABLE = "CUBRIDGE_TOOL"
WHERE_THE_TOOL_COMES_FROM = ("scripts/build builds it as build/tools/cubridge, `cmake --install` installs it; "
                             f"put it on PATH or name it in {TOOL_VARIABLE}")


def _is_python_script(path: str) -> bool:
    """True for a file whose first line is a ``#!`` naming python: a console script like this one
    (another environment's, say), which would hand the command back rather than run it."""
    try:
        with open(path, "rb") as file:
            first = file.readline(512)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _is_this_script(path: str) -> bool:
    own = {os.path.realpath(p) for p in (sys.argv[0], __file__) if p}
    return os.path.realpath(path) in own or _is_python_script(path)


def find_tool() -> str | None:
    """The C++ ``cubridge`` tool: $CUBRIDGE_TOOL when set, else the first executable ``cubridge``
    on PATH; either only when it is neither this script nor another Python script (which would
    run this again, and so on for ever). None when there is none."""
    named = os.environ.get(TOOL_VARIABLE)
    if named:
        return None if _is_this_script(named) else named
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder or ".", "cubridge")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK) and not _is_this_script(candidate):
            return candidate
    return None


def _forward(argv: list[str]) -> int:
    """Runs the C++ tool in place of this process (its exit code and signals are the caller's to
    see), or says in one line why it cannot and returns EXIT_USAGE."""
    tool = find_tool()
    named = os.environ.get(TOOL_VARIABLE)
    if tool is None and named:
        print(f"cubridge: {TOOL_VARIABLE}='{named}' is a Python script (a cubridge console script, "
              f"perhaps), not the C++ cubridge tool that runs '{argv[0]}'", file=sys.stderr)
        return EXIT_USAGE
    if tool is None:
        print(f"cubridge: '{argv[0]}' is not {' or '.join(OWN_COMMANDS)}, which this Python cubridge runs "
              f"itself, and the C++ cubridge tool, which runs the other commands, is not installed "
              f"({WHERE_THE_TOOL_COMES_FROM})", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # argv[0] as a shell gives it, so the tool's usage lines read `cubridge sign ...`.
        os.execv(tool, [os.path.basename(tool), *argv])
    except OSError as e:  # only a failed exec returns
        print(f"cubridge: cannot run the C++ cubridge tool '{tool}' for '{argv[0]}': {e.strerror}",
              file=sys.stderr)
        return EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    tool = find_tool()
    # The console script is `cubridge`; `python -m cubridge` runs this file itself.
    prog = "python -m cubridge" if os.path.basename(sys.argv[0]) == "__main__.py" else "cubridge"
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.splitlines()[0],
        epilog=("Any other subcommand (keygen, sign, push, guard, coldstart, fleet, ...) runs the "
                "C++ cubridge tool with the same arguments: "
                + (tool if tool else f"not installed ({WHERE_THE_TOOL_COMES_FROM})")
                + "."))
    parser.add_argument("--version", action="version", version=f"cubridge {_cubridge.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{doctor,inspect,...}")
    doctor = commands.add_parser("doctor", help="Devices, driver, runtime, loading mode, JIT cache and MPS")
    doctor.add_argument("--json", action="store_true", help="Print the report as JSON")
    inspect = commands.add_parser(
        "inspect", help="What a cubin, fatbin, PTX file or signed bundle holds (no GPU needed)")
    inspect.add_argument("file", help="The image or bundle file")
    inspect.add_argument("--json", action="store_true", help="Print the result as JSON")
    inspect.add_argument("--key", action="append", default=[], metavar="PUBLIC_KEY_FILE",
                         help="Verify a bundle's signature with this public key file (repeatable)")
    return parser


def _doctor(as_json: bool) -> int:
    report_text = _cubridge.diagnose()
    report = json.loads(report_text)
    print(json.dumps(report, indent=2) if as_json else _cubridge.render_doctor(report_text), end="\n" if as_json else "")
    if not report["driver"]["available"]:
        print(f"cubridge: {report['driver']['reason']}", file=sys.stderr)
        return EXIT_NO_DRIVER
    return EXIT_OK


def _inspect(file: str, as_json: bool, key_files: list[str]) -> int:
    print(_cubridge.inspect_report(file, key_files, as_json), end="")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns its exit code (or becomes the C++ tool, for its commands)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and not argv[0].startswith("-") and argv[0] not in OWN_COMMANDS:
        return _forward(argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as stop:  # argparse exits 2 for a bad command line; cubridge says 64
        return EXIT_OK if stop.code == 0 else EXIT_USAGE
    try:
        if args.command == "doctor":
            return _doctor(args.json)
        return _inspect(args.file, args.json, args.key)
    except DriverUnavailable as e:
        print(f"cubridge: {e}", file=sys.stderr)
        return EXIT_NO_DRIVER
    except Error as e:
        print(f"cubridge: {e}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())

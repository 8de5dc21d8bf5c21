"""The ``kvpool`` command line: ``kvpool bench`` and ``kvpool simulate TRACE``.

``kvpool bench`` runs the fixed workloads of :mod:`kvpool.bench` through kvpool and its
plain-Python reference and prints a table (``--json``: one JSON object per workload).

``kvpool simulate TRACE`` replays a Mooncake trace through kvpool's pool and prints its
prefix-cache behaviour per capacity (:mod:`kvpool.simulate_cli`).

Exit status: 0 on success, 2 for a usage error or bad input (a message on stderr, no
traceback), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

import kvpool
from kvpool.bench import DEFAULT_REPS, WORKLOADS, format_table, resolve_names, run_bench
from kvpool.cli_common import CliError, Progress, positive_int
from kvpool.events_cli import add_events
from kvpool.simulate import IMPL_NAMES, PlotUnavailableError, get_impl
from kvpool.simulate_cli import add_simulate
from kvpool.traces import TraceError, load_trace, synthetic_trace

__all__ = ["Progress", "build_parser", "main"]


# --------------------------------------------------------------------------------------------
# The parser.
# --------------------------------------------------------------------------------------------


def _version() -> str:
    """kvpool's version (imported lazily: the parser works without the compiled extension)."""
    try:
        from kvpool import __version__
    except ImportError:
        return "(compiled extension not built)"
    return __version__


def build_parser() -> argparse.ArgumentParser:
    """The ``kvpool`` argument parser with its ``bench``, ``simulate`` and ``events`` subcommands."""
    parser = argparse.ArgumentParser(prog="kvpool", description="kvpool: a KV-cache block manager, in Rust.")
    parser.add_argument("--version", action="version", version=f"kvpool {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_bench(commands)
    add_simulate(commands)
    add_events(commands)
    return parser


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``bench`` subcommand."""
    bench = commands.add_parser(
        "bench",
        help="benchmark kvpool against its plain-Python reference",
        description="Run four fixed workloads through kvpool and kvpool.reference: serve-random "
        "(allocate and free 44-block requests, caching off), prefix-warmup (32 requests sharing a "
        "1,000-token prefix, cold then warm), churn (allocate, cache and free 64 blocks in a "
        "100,000-block pool, first without and then with eviction) and trace-replay (a Mooncake "
        "trace in 20,000 blocks); ratio = how many times faster kvpool is. They are the workloads "
        "W1-W4 of the shared vLLM peer benchmark, so figures compare with vLLM's.",
    )
    bench.add_argument("--only", metavar="NAMES",
                       help=f"comma list of workloads: {', '.join(WORKLOADS)} (or W1..W4, in that order); default all")
    bench.add_argument("--reps", type=positive_int, default=DEFAULT_REPS, metavar="N",
                       help=f"timed runs per figure, median reported (default {DEFAULT_REPS})")
    bench.add_argument("--json", action="store_true", help="print one JSON object per workload")
    bench.add_argument("--trace", metavar="PATH",
                       help="Mooncake trace for trace-replay (default: the seeded synthetic trace)")
    bench.add_argument("--impl", choices=("both", *IMPL_NAMES), default="both",
                       help="implementations to run (default both)")
    bench.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    bench.set_defaults(func=cmd_bench)


# --------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    """``kvpool bench``: run the workloads, print the table or JSON lines."""
    start = time.perf_counter()
    try:
        names = resolve_names(args.only)
    except ValueError as exc:
        raise CliError(f"--only: {exc}") from None
    trace = load_trace(args.trace) if args.trace else synthetic_trace()
    impls = [get_impl(name) for name in (IMPL_NAMES if args.impl == "both" else (args.impl,))]
    log = None if args.quiet or not sys.stderr.isatty() else _log_line
    results = run_bench(names, impls, reps=args.reps, trace=trace, log=log)
    if args.json:
        for result in results:
            print(json.dumps(result.to_dict(args.reps)))
        return 0
    print(f"kvpool bench: kvpool {_version()}, Python {sys.version.split()[0]}, "
          f"median of {args.reps} runs; ratio = how many times faster kvpool is than kvpool.reference")
    print(format_table(results))
    print(f"total wall time: {time.perf_counter() - start:.1f} s")
    return 0


def _log_line(text: str) -> None:
    """A progress line on stderr."""
    print(f"  running {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Entry point.
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvpool`` command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        return int(args.func(args))
    except (CliError, TraceError, PlotUnavailableError, kvpool.KVPoolError) as exc:
        # A KVPoolError here is an argument the pool refused (a block size, a pool too
        # large for memory): the user's input, reported as such.
        print(f"kvpool {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say, and nothing at exit either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130

"""The ``kvpool`` command line: ``kvpool bench`` and ``kvpool simulate TRACE``.

``kvpool bench`` runs the fixed workloads of :mod:`kvpool.bench` through kvpool and its
plain-Python reference and prints a table (``--json``: one JSON object per workload).

``kvpool simulate TRACE`` replays a Mooncake trace through kvpool's pool
(:mod:`kvpool.simulate`) and prints its prefix-cache behaviour per capacity. With no
``--capacity-blocks`` it replays in an unbounded pool only; with capacities it replays each one,
plus the unbounded pool if ``--unbounded`` or ``--plot`` is given. ``--plot`` without
capacities sweeps eight capacities up to the unbounded pool's size.

Exit status: 0 on success, 2 for a usage error or bad input (a message on stderr, no
traceback), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TextIO

import kvpool
from kvpool.events_cli import add_events
from kvpool.bench import DEFAULT_REPS, WORKLOADS, format_table, resolve_names, run_bench
from kvpool.simulate_fleet import ROUTERS, fleet_table, simulate_fleet
from kvpool.simulate_layers import PRESETS, layers_table, parse_layout, simulate_layers
from kvpool.reference.eviction import EVICTION_POLICIES
from kvpool.simulate_belady import simulate_belady
from kvpool.simulate_policies import policies_table, save_policies_plot
from kvpool.simulate import (
    IMPL_NAMES,
    PlotUnavailableError,
    ProgressFn,
    ReplayResult,
    default_sweep,
    get_impl,
    load_pyplot,
    plot_path_problem,
    save_plot,
    simulate,
)
from kvpool.traces import MOONCAKE_BLOCK_TOKENS, Trace, TraceError, load_trace, synthetic_trace

__all__ = ["Progress", "build_parser", "main"]


class CliError(Exception):
    """A problem to report as ``kvpool CMD: error: ...`` with exit status 2."""


# --------------------------------------------------------------------------------------------
# Progress bar.
# --------------------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a stream (stderr), for runs longer than ``delay`` seconds.

    Plain writes, redrawn at most every ``interval`` seconds; ``close`` erases it. Disabled
    (every call a no-op) when ``enabled`` is false, by default unless the stream is a tty.
    """

    WIDTH = 30

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        delay: float = 0.3,
        interval: float = 0.1,
    ) -> None:
        """A bar for ``total`` steps, labelled ``label``."""
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label, self.total = label, max(total, 1)
        self.delay, self.interval = delay, interval
        self._start = time.monotonic()
        self._last_draw = float("-inf")
        self._drawn = 0

    def __call__(self, done: int) -> None:
        """Report ``done`` steps finished (drawn only when due)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._start < self.delay or now - self._last_draw < self.interval:
            return
        self._last_draw = now
        filled = self.WIDTH * min(done, self.total) // self.total
        text = f"\r{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total}"
        self.stream.write(text)
        self.stream.flush()
        self._drawn = len(text)

    def close(self) -> None:
        """Erase the bar if it was drawn."""
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0


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


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``kvpool`` argument parser with its ``bench``, ``simulate`` and ``events`` subcommands."""
    parser = argparse.ArgumentParser(prog="kvpool", description="kvpool: a KV-cache block manager, in Rust.")
    parser.add_argument("--version", action="version", version=f"kvpool {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_bench(commands)
    _add_simulate(commands)
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
    bench.add_argument("--reps", type=_positive_int, default=DEFAULT_REPS, metavar="N",
                       help=f"timed runs per figure, median reported (default {DEFAULT_REPS})")
    bench.add_argument("--json", action="store_true", help="print one JSON object per workload")
    bench.add_argument("--trace", metavar="PATH",
                       help="Mooncake trace for trace-replay (default: the seeded synthetic trace)")
    bench.add_argument("--impl", choices=("both", *IMPL_NAMES), default="both",
                       help="implementations to run (default both)")
    bench.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    bench.set_defaults(func=cmd_bench)


def _add_simulate(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``simulate`` subcommand."""
    sim = commands.add_parser(
        "simulate",
        help="replay a Mooncake trace and report prefix-cache hit ratios",
        description="Replay a Mooncake-format trace (one JSON object per line with timestamp, "
        "input_length, output_length, hash_ids) request by request through kvpool's pool. "
        "Without --capacity-blocks the pool is unbounded (never evicts).",
        epilog="Each hash id is one block; a request hits the longest cached prefix of its ids, then "
        "all its blocks are cached and released tail-first; a full pool evicts the least recently "
        "used block; a request longer than the capacity keeps its first blocks. token_hit_ratio "
        "counts min(hit_blocks * block_tokens, input_length) per request; seconds is pool time only.",
    )
    sim.add_argument("trace", metavar="TRACE", help="the trace file (JSON lines)")
    sim.add_argument("--capacity-blocks", type=_positive_int, nargs="+", metavar="N",
                     help="pool capacities to replay with, in blocks (a sweep)")
    sim.add_argument("--unbounded", action="store_true",
                     help="also replay in a pool that never evicts (the default without capacities)")
    sim.add_argument("--block-tokens", type=_positive_int, default=MOONCAKE_BLOCK_TOKENS, metavar="N",
                     help=f"tokens per hash id (default {MOONCAKE_BLOCK_TOKENS})")
    sim.add_argument("--json", action="store_true", help="print one JSON object per capacity")
    sim.add_argument("--plot", metavar="PATH",
                     help="write a PNG of hit ratio against capacity, the unbounded ceiling marked "
                     "(needs kvpool[plot]; implies --unbounded; without --capacity-blocks, sweeps 8 capacities)")
    sim.add_argument("--impl", choices=IMPL_NAMES, default="kvpool",
                     help="pool implementation (default kvpool)")
    sim.add_argument("--model-layers", nargs="+", metavar="LAYOUT",
                     help="replay a hybrid model's KV-cache groups instead: a preset ("
                     + ", ".join(sorted(PRESETS)) + ") or a comma list of full, swa:W, chunked:C, each "
                     "optionally xN; several for a side-by-side table. Capacities count all groups' blocks; "
                     "without --capacity-blocks, room for every distinct id in every group")
    sim.add_argument("--instances", type=_positive_int, default=None, metavar="N",
                     help="replay a fleet of N instances behind a router instead (each with the capacity "
                     "of --capacity-blocks, default 2000)")
    sim.add_argument("--router", nargs="+", choices=("round-robin", "kv-aware"), default=None,
                     help="with --instances: the routers to compare (default both)")
    sim.add_argument("--retention-interval", type=int, default=None, metavar="TOKENS",
                     help="with --model-layers: vLLM's prefix_cache_retention_interval for sliding windows "
                     "(default: a tail at every block)")
    sim.add_argument("--policy", nargs="+", choices=EVICTION_POLICIES, default=None, metavar="NAME",
                     help="eviction policies to compare side by side (" + ", ".join(EVICTION_POLICIES)
                     + "; default lru alone); Belady's MIN, the offline bound, is added as the reference "
                     "line at every bounded capacity")
    sim.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    sim.set_defaults(func=cmd_simulate)


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
# simulate
# --------------------------------------------------------------------------------------------


def cmd_simulate(args: argparse.Namespace) -> int:
    """``kvpool simulate``: replay the trace per capacity, print a table or JSON lines."""
    if args.model_layers:
        return _simulate_layers(args)
    if args.instances or args.router:
        return _simulate_fleet(args)
    if args.policy:
        return _simulate_policies(args)
    if args.plot:
        _check_plot(args.plot)
    trace = load_trace(args.trace)
    capacities = _capacities(args, trace)
    bars: list[Progress] = []

    def progress(capacity: int | None) -> ProgressFn:
        if bars:
            bars[-1].close()
        label = "unbounded" if capacity is None else f"capacity {capacity}"
        bars.append(Progress(label, trace.num_requests, enabled=False if args.quiet else None))
        return bars[-1]

    results = simulate(trace, capacities, block_tokens=args.block_tokens, impl=get_impl(args.impl),
                       progress=progress)
    if bars:
        bars[-1].close()
    if args.json:
        for result in results:
            print(json.dumps(result.to_dict()))
    else:
        print(_simulate_table(trace, results, args.block_tokens))
    if args.plot:
        _write_plot(results, args.plot)
    return 0


def _check_plot(path: str) -> None:
    """Fail before the replay, not after it, if matplotlib is missing or ``path`` cannot take a plot."""
    load_pyplot()
    problem = plot_path_problem(path)
    if problem is not None:
        raise CliError(f"--plot {problem}")


def _simulate_policies(args: argparse.Namespace) -> int:
    """``kvpool simulate --policy ...``: each policy and Belady's MIN at each capacity."""
    if args.plot:
        _check_plot(args.plot)
    trace = load_trace(args.trace)
    capacities = _capacities(args, trace)
    policies = list(dict.fromkeys(args.policy))
    impl = get_impl(args.impl)
    results: list[ReplayResult] = []
    for policy in policies:
        bounded = [c for c in capacities if c is not None]
        results += simulate(trace, bounded, block_tokens=args.block_tokens, impl=impl, policy=policy)
    results += [simulate_belady(trace, c, block_tokens=args.block_tokens) for c in capacities if c is not None]
    if None in capacities:
        results += simulate(trace, [None], block_tokens=args.block_tokens, impl=impl)
    if args.json:
        for result in results:
            print(json.dumps(result.to_dict()))
    else:
        print(policies_table(trace, results, [*policies, "belady"]))
    if args.plot:
        try:
            save_policies_plot(results, args.plot)
        except OSError as exc:
            raise CliError(f"cannot write the plot to {args.plot}: {exc.strerror or exc}") from None
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def _simulate_fleet(args: argparse.Namespace) -> int:
    """``kvpool simulate --instances N --router ...``: the fleet's hit ratio and load per router."""
    if args.plot:
        raise CliError("--plot is not available with --instances")
    trace = load_trace(args.trace)
    instances = args.instances or 1
    results = [simulate_fleet(trace, instances, capacity, router, block_tokens=args.block_tokens)
               for capacity in (args.capacity_blocks or [2000]) for router in (args.router or ROUTERS)]
    if args.json:
        for r in results:
            print(json.dumps(r.to_dict()))
    else:
        print(f"{trace.name}: {trace.num_requests} requests, {trace.num_blocks} blocks, {instances} instances")
        print(fleet_table(results))
    return 0


def _simulate_layers(args: argparse.Namespace) -> int:
    """``kvpool simulate --model-layers``: each layout at each capacity, a table or JSON lines."""
    if args.plot:
        raise CliError("--plot is not available with --model-layers")
    trace = load_trace(args.trace)
    results = []
    for layout in args.model_layers:
        try:
            groups = parse_layout(layout)
        except ValueError as exc:
            raise CliError(f"--model-layers: {exc}") from None
        capacities = args.capacity_blocks or [max(trace.distinct_ids(), trace.max_request_blocks) * len(groups)]
        for capacity in capacities:
            try:
                results.append(simulate_layers(trace, layout, capacity, block_tokens=args.block_tokens,
                                               retention_interval=args.retention_interval))
            except kvpool.KVPoolError as exc:
                raise CliError(f"--model-layers {layout}: {exc}") from None
    if args.json:
        for r in results:
            print(json.dumps(r.to_dict()))
    else:
        print(f"{trace.name}: {trace.num_requests} requests, {trace.num_blocks} blocks")
        print(layers_table(results, args.block_tokens))
    return 0


def _capacities(args: argparse.Namespace, trace: Trace) -> list[int | None]:
    """The capacities to replay (``None`` = unbounded), in the order given, unbounded last."""
    given: list[int | None] = list(dict.fromkeys(args.capacity_blocks or []))
    if args.plot and not given:
        given = list(default_sweep(trace))
    if not given or args.unbounded or args.plot:
        given.append(None)
    return given


def _simulate_table(trace: Trace, results: Sequence[ReplayResult], block_tokens: int) -> str:
    """The text output of ``kvpool simulate``."""
    lines = [
        f"{trace.name}: {trace.num_requests} requests, {trace.num_blocks} blocks "
        f"({trace.distinct_ids()} distinct ids), {block_tokens} tokens per block",
        f"{'capacity':>10}  {'hit_blocks':>10}  {'block_hit':>9}  {'token_hit':>9}  {'evictions':>10}  {'pool_s':>8}",
    ]
    for r in results:
        capacity = "unbounded" if r.capacity_blocks is None else str(r.capacity_blocks)
        lines.append(
            f"{capacity:>10}  {r.hit_blocks:>10}  {r.block_hit_ratio:>9.4f}  {r.token_hit_ratio:>9.4f}  "
            f"{r.evictions:>10}  {r.seconds:>8.4f}"
        )
    return "\n".join(lines)


def _write_plot(results: Sequence[ReplayResult], path: str) -> None:
    """Save the plot, turning a write failure into a :class:`CliError`."""
    try:
        save_plot(results, path)
    except OSError as exc:
        raise CliError(f"cannot write the plot to {path}: {exc.strerror or exc}") from None
    print(f"plot written to {path}", file=sys.stderr)


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
    except (CliError, TraceError, PlotUnavailableError) as exc:
        print(f"kvpool {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130

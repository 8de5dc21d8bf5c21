"""``kvpool simulate TRACE``: the capacity planner's command.

It replays a Mooncake trace (a file, ``.gz``, or ``-`` for standard input) through kvpool's
pool and prints its prefix-cache behaviour per capacity, in blocks, tokens, or GiB of a given
model's KV cache. Two replay models:

* **sequential** (the default, :mod:`kvpool.simulate`): requests one at a time in file order,
  each releasing its blocks before the next; timestamps and outputs are ignored. It isolates the
  cache policy from load; its counts are the figures quoted since the first release.
* **timed** (``--timed``, :mod:`kvpool.simulate_timed`): arrivals by timestamp, requests that
  overlap and hold their blocks while they run under a service model (prefill and decode speed,
  a concurrency limit), outputs that take blocks, preemption when the pool runs short.

``--policy`` compares eviction policies (with Belady's MIN in the sequential mode),
``--model-layers`` hybrid models and ``--instances`` a fleet behind a router. Every option and
path is checked before any replay; a trace whose lengths disagree with its ids at
``--block-tokens``, whose timestamps go back, or whose ids are not prefix-chained gets a
warning on stderr.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import kvpool
from kvpool.capacity import MODEL_PRESETS, CapacityUnits, blocks_for_gib, blocks_for_tokens, parse_model_shape
from kvpool.cli_common import CliError, Progress, block_size_int, positive_float, positive_int, token_rate
from kvpool.reference.eviction import EVICTION_POLICIES
from kvpool.simulate import (
    IMPL_NAMES,
    ProgressFn,
    default_sweep,
    get_impl,
    load_pyplot,
    plot_path_problem,
    policy_args,
    save_plot,
    simulate,
)
from kvpool.simulate_belady import simulate_belady
from kvpool.simulate_fleet import ROUTERS, fleet_table, simulate_fleet
from kvpool.simulate_layers import PRESETS, layers_table, parse_layout, simulate_layers
from kvpool.simulate_policies import policies_table
from kvpool.simulate_timed import ServiceModel, TimedResult, simulate_timed
from kvpool.traces import MOONCAKE_BLOCK_TOKENS, Trace, is_prefix_consistent, load_trace, trace_warnings

__all__ = ["add_simulate", "cmd_simulate"]

SEQUENTIAL_MODEL = (
    "Sequential mode (the default): requests run one at a time in file order; each hash id is one "
    "block; a request hits the longest cached prefix of its ids, then all its blocks are cached and "
    "released tail-first; a full pool evicts by the eviction policy (LRU by default); a request "
    "longer than the capacity keeps its first blocks; timestamps and outputs are ignored."
)
TIMED_MODEL = (
    "Timed mode (--timed): requests arrive at their timestamps into one FCFS queue; the head is "
    "admitted while fewer than --max-running run and the pool holds its prompt (hit, allocate, cache "
    "at once); its prefill takes its uncached tokens / --prefill-tps seconds, then it decodes its "
    "output at --decode-tps tokens per second, taking a block whenever an output token starts one; "
    "when none is free the newest running request is preempted and restarts later; a finished "
    "request releases its blocks tail-first."
)
RATIOS = (
    "token_hit_ratio counts min(hit_blocks * block_tokens, input_length) per request; capacities in "
    "tokens or GiB are rounded down to whole blocks; pool_s is pool time only."
)



def _policy_name(text: str) -> str:
    """``--policy``'s argument type: a name :func:`kvpool.simulate.policy_args` takes."""
    try:
        policy_args(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text

def add_simulate(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``simulate`` subcommand."""
    sim = commands.add_parser(
        "simulate",
        help="replay a Mooncake trace and report prefix-cache hit ratios",
        description="Replay a Mooncake-format trace (one JSON object per line with timestamp, "
        "input_length, output_length, hash_ids) through kvpool's pool, per capacity. Without a "
        "capacity the pool is unbounded (never evicts).",
        epilog=f"{SEQUENTIAL_MODEL} {TIMED_MODEL} {RATIOS}",
    )
    sim.add_argument("trace", metavar="TRACE", help="the trace: JSON lines, gzip-compressed if it ends in .gz, "
                     "or - for standard input")
    cap = sim.add_argument_group("capacity (one unit; several values for a sweep)")
    units = cap.add_mutually_exclusive_group()
    units.add_argument("--capacity-blocks", type=positive_int, nargs="+", metavar="N",
                       help="pool capacities in blocks of --block-tokens")
    units.add_argument("--capacity-tokens", type=positive_int, nargs="+", metavar="N",
                       help="pool capacities in tokens")
    units.add_argument("--capacity-gib", type=positive_float, nargs="+", metavar="GIB",
                       help="pool capacities in GiB of KV cache (needs --model or --kv-bytes-per-token)")
    model = cap.add_mutually_exclusive_group()
    model.add_argument("--model", metavar="SHAPE",
                       help="the model whose KV cache fills the pool: a preset (" + ", ".join(sorted(MODEL_PRESETS))
                       + ") or LAYERS:KV_HEADS:HEAD_DIM[:DTYPE] (bf16 by default; fp32, fp16, fp8); "
                       "adds GiB to the output")
    model.add_argument("--kv-bytes-per-token", type=positive_int, metavar="B",
                       help="the model's KV-cache bytes per token, given directly")
    cap.add_argument("--unbounded", action="store_true",
                     help="also replay in a pool that never evicts (the default without capacities)")
    sim.add_argument("--block-tokens", type=block_size_int, default=MOONCAKE_BLOCK_TOKENS, metavar="N",
                     help=f"tokens per hash id (default {MOONCAKE_BLOCK_TOKENS})")
    sim.add_argument("--json", action="store_true", help="print one JSON object per capacity")
    sim.add_argument("--plot", metavar="PATH",
                     help="write a PNG of token hit ratio against capacity (GiB with a model, else tokens), "
                     "one curve per policy, the unbounded ceiling dotted (needs kvpool[plot]; implies "
                     "--unbounded; without capacities, sweeps 8)")
    sim.add_argument("--impl", choices=IMPL_NAMES, default="kvpool",
                     help="pool implementation (default kvpool)")
    sim.add_argument("--policy", nargs="+", type=_policy_name, default=None, metavar="NAME",
                     help="eviction policies to compare side by side (" + ", ".join(EVICTION_POLICIES)
                     + ", or adaptive:H for the adaptive policy with a horizon of H blocks freed; default "
                     "lru alone); in the sequential mode Belady's MIN, the offline bound, is added as the "
                     "reference line at every bounded capacity")
    sim.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    timed = sim.add_argument_group("timed mode")
    timed.add_argument("--timed", action="store_true",
                       help="replay arrivals by timestamp with overlapping requests (see below); "
                       "the same as --mode timed")
    timed.add_argument("--mode", nargs="+", choices=("sequential", "timed"), default=None,
                       help="the replay models to run, in order (default sequential); both for one "
                       "table each and one plot")
    defaults = ServiceModel()
    timed.add_argument("--prefill-tps", type=token_rate, default=defaults.prefill_tokens_per_s, metavar="T",
                       help=f"prefill tokens per second (default {defaults.prefill_tokens_per_s:g})")
    timed.add_argument("--decode-tps", type=token_rate, default=defaults.decode_tokens_per_s, metavar="T",
                       help=f"decode tokens per second per request (default {defaults.decode_tokens_per_s:g})")
    timed.add_argument("--max-running", type=positive_int, default=defaults.max_running, metavar="N",
                       help=f"requests running at once (default {defaults.max_running})")
    other = sim.add_argument_group("other models")
    other.add_argument("--model-layers", nargs="+", metavar="LAYOUT",
                       help="replay a hybrid model's KV-cache groups instead: a preset ("
                       + ", ".join(sorted(PRESETS)) + ") or a comma list of full, swa:W, chunked:C, each "
                       "optionally xN; several for a side-by-side table. Capacities count all groups' blocks; "
                       "without --capacity-blocks, room for every distinct id in every group")
    other.add_argument("--retention-interval", type=int, default=None, metavar="TOKENS",
                       help="with --model-layers: vLLM's prefix_cache_retention_interval for sliding windows "
                       "(default: a tail at every block)")
    other.add_argument("--instances", type=positive_int, default=None, metavar="N",
                       help="replay a fleet of N instances behind a router instead (each with the capacity "
                       "of --capacity-blocks, default 2000)")
    other.add_argument("--router", nargs="+", choices=("round-robin", "kv-aware"), default=None,
                       help="with --instances: the routers to compare (default both)")
    sim.set_defaults(func=cmd_simulate)


def _check_combinations(args: argparse.Namespace) -> None:
    """Refuse options that would be ignored or that contradict each other (each model reads
    only its own)."""
    timed = args.timed or (args.mode is not None and "timed" in args.mode)
    if args.timed and args.mode is not None and "timed" not in args.mode:
        raise CliError("--timed and --mode without timed contradict each other")
    if args.router and not args.instances:
        raise CliError("--router needs --instances")
    if args.model_layers and args.instances:
        raise CliError("--model-layers and --instances are two models: pick one")
    other = "--model-layers" if args.model_layers else "--instances" if args.instances else None
    if other:
        given = [name for name, on in (("--policy", args.policy), ("--unbounded", args.unbounded),
                                       ("--impl", args.impl != "kvpool"), ("--model", args.model),
                                       ("--kv-bytes-per-token", args.kv_bytes_per_token)) if on]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise CliError(f"{', '.join(given)} {verb} to the sequential and timed replays, not to {other}")
    if args.retention_interval is not None and not args.model_layers:
        raise CliError("--retention-interval needs --model-layers")
    defaults = ServiceModel()
    service = ((args.prefill_tps, defaults.prefill_tokens_per_s, "--prefill-tps"),
               (args.decode_tps, defaults.decode_tokens_per_s, "--decode-tps"),
               (args.max_running, defaults.max_running, "--max-running"))
    given = [name for value, default, name in service if value != default]
    if given and not timed:
        verb = "applies" if len(given) == 1 else "apply"
        raise CliError(f"{', '.join(given)} {verb} to the timed mode (--timed)")


def cmd_simulate(args: argparse.Namespace) -> int:
    """``kvpool simulate``: check every option, load the trace, replay, print."""
    _check_combinations(args)
    units = _units(args)
    capacities = _given_capacities(args, units)
    if args.model_layers or args.instances or args.router:
        if args.capacity_tokens or args.capacity_gib or args.timed or args.mode:
            raise CliError("--model-layers and --instances take --capacity-blocks only and no --timed")
        if args.plot:
            raise CliError("--plot is not available with --model-layers or --instances")
        return _simulate_layers(args) if args.model_layers else _simulate_fleet(args)
    if args.plot:
        _check_plot(args.plot)
    modes = list(dict.fromkeys(args.mode or (["timed"] if args.timed else ["sequential"])))
    trace = _load(args)
    sweep = _capacities(args, trace, capacities)
    parts = []
    for mode in modes:
        if mode == "timed":
            parts.append(_run_timed(args, trace, sweep, units))
        elif args.policy:
            parts.append(_run_policies(args, trace, sweep, units))
        else:
            parts.append(_run_sequential(args, trace, sweep, units))
    results = [r for rs, _ in parts for r in rs]
    if args.json:
        for result in results:
            print(json.dumps(_row(result, units)))
    else:
        print("\n\n".join(table() for _, table in parts))
    if args.plot:
        try:
            save_plot(results, args.plot, units=units)
        except OSError as exc:
            raise CliError(f"cannot write the plot to {args.plot}: {exc.strerror or exc}") from None
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------------------------
# Options and input.
# --------------------------------------------------------------------------------------------


def _units(args: argparse.Namespace) -> CapacityUnits:
    """The capacity units of the options (``CliError`` for GiB without a model)."""
    bytes_per_token = args.kv_bytes_per_token
    if args.model is not None:
        try:
            bytes_per_token = parse_model_shape(args.model).bytes_per_token
        except ValueError as exc:
            raise CliError(f"--model: {exc}") from None
    if args.capacity_gib and bytes_per_token is None:
        raise CliError("--capacity-gib needs the model's KV bytes per token: --model or --kv-bytes-per-token")
    return CapacityUnits(args.block_tokens, bytes_per_token)


def _given_capacities(args: argparse.Namespace, units: CapacityUnits) -> list[int]:
    """The capacities given, in blocks, duplicates dropped (``CliError`` for one under a block)."""
    if args.capacity_tokens:
        blocks = [blocks_for_tokens(t, units.block_tokens) for t in args.capacity_tokens]
        unit, given = "tokens", args.capacity_tokens
    elif args.capacity_gib:
        assert units.bytes_per_token is not None
        blocks = [blocks_for_gib(g, units.bytes_per_token, units.block_tokens) for g in args.capacity_gib]
        unit, given = "GiB", args.capacity_gib
    else:
        return list(dict.fromkeys(args.capacity_blocks or []))
    for value, b in zip(given, blocks):
        if b < 1:
            raise CliError(f"--capacity-{unit.lower()} {value} holds less than one block of {units.block_tokens} tokens")
    return list(dict.fromkeys(blocks))


def _capacities(args: argparse.Namespace, trace: Trace, given: list[int]) -> list[int | None]:
    """The capacities to replay (``None`` = unbounded), in the order given, unbounded last."""
    out: list[int | None] = list(given)
    if args.plot and not out:
        out = list(default_sweep(trace))
    if not out or args.unbounded or args.plot:
        out.append(None)
    return out


def _load(args: argparse.Namespace) -> Trace:
    """The trace, with its warnings on stderr."""
    trace = load_trace(args.trace)
    for warning in trace_warnings(trace, args.block_tokens):
        print(f"kvpool simulate: warning: {warning}", file=sys.stderr)
    return trace


def _check_plot(path: str) -> None:
    """Fail before the replay, not after it, if matplotlib is missing or ``path`` cannot take a plot."""
    load_pyplot()
    problem = plot_path_problem(path)
    if problem is not None:
        raise CliError(f"--plot {problem}")


class _Bars:
    """Progress bars, one per replay: calling it closes the last bar and starts the next."""

    def __init__(self, args: argparse.Namespace, trace: Trace) -> None:
        self._enabled = False if args.quiet else None
        self._total = trace.num_requests
        self._last: Progress | None = None

    def __call__(self, capacity: int | None, label: str = "") -> ProgressFn:
        self.close()
        name = "unbounded" if capacity is None else f"capacity {capacity}"
        self._last = Progress(f"{label}{name}", self._total, enabled=self._enabled)
        return self._last

    def close(self) -> None:
        if self._last is not None:
            self._last.close()


# --------------------------------------------------------------------------------------------
# The modes.
# --------------------------------------------------------------------------------------------


Part = tuple[list[Any], Callable[[], str]]
"""One mode's results and the function that prints their table."""


def _run_sequential(args: argparse.Namespace, trace: Trace, capacities: list[int | None],
                    units: CapacityUnits) -> Part:
    """The sequential replay at each capacity."""
    bars = _Bars(args, trace)
    results: list[Any] = simulate(trace, capacities, block_tokens=args.block_tokens, impl=get_impl(args.impl),
                                  progress=bars)
    bars.close()
    return results, lambda: _sequential_table(trace, results, units)


def _run_policies(args: argparse.Namespace, trace: Trace, capacities: list[int | None],
                  units: CapacityUnits) -> Part:
    """``--policy ...``: each policy and Belady's MIN at each capacity, sequentially."""
    policies = list(dict.fromkeys(args.policy))
    impl = get_impl(args.impl)
    bars = _Bars(args, trace)
    bounded = [c for c in capacities if c is not None]
    results: list[Any] = []
    for policy in policies:
        results += simulate(trace, bounded, block_tokens=args.block_tokens, impl=impl, policy=policy,
                            progress=functools.partial(bars, label=f"{policy} "))
    # MIN knows when an id is asked for next; that is the next hit only when every request
    # reaches its ids through the same prefix (else MIN is no bound, and is left out).
    reference = ["belady"] if is_prefix_consistent(trace) else []
    if reference:
        results += [simulate_belady(trace, c, block_tokens=args.block_tokens) for c in bounded]
    elif bounded:
        print("kvpool simulate: Belady's MIN left out: the trace's ids are not prefix-chained, so it "
              "is no bound on the hits", file=sys.stderr)
    if None in capacities:
        results += simulate(trace, [None], block_tokens=args.block_tokens, impl=impl, progress=bars)
    bars.close()
    return results, lambda: policies_table(trace, results, [*policies, *reference])


def _run_timed(args: argparse.Namespace, trace: Trace, capacities: list[int | None],
               units: CapacityUnits) -> Part:
    """The timed replay: each policy at each capacity under the service model of the flags."""
    service = ServiceModel(args.prefill_tps, args.decode_tps, args.max_running)
    impl = get_impl(args.impl)
    bars = _Bars(args, trace)
    results: list[Any] = [
        simulate_timed(trace, c, block_tokens=args.block_tokens, service=service, policy=policy, impl=impl,
                       progress=bars(c, f"timed {policy} "))
        for policy in dict.fromkeys(args.policy or ["lru"]) for c in capacities
    ]
    bars.close()
    return results, lambda: _timed_table(trace, results, units, service)


def _simulate_fleet(args: argparse.Namespace) -> int:
    """``--instances N --router ...``: the fleet's hit ratio and load per router."""
    trace = _load(args)
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
    """``--model-layers``: each layout at each capacity, a table or JSON lines."""
    layouts = []
    for layout in args.model_layers:
        try:
            layouts.append((layout, parse_layout(layout)))
        except ValueError as exc:
            raise CliError(f"--model-layers: {exc}") from None
    trace = _load(args)
    results = []
    for layout, groups in layouts:
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


# --------------------------------------------------------------------------------------------
# Output.
# --------------------------------------------------------------------------------------------


def _row(result: Any, units: CapacityUnits) -> dict[str, Any]:
    """A result as a JSON object, with its capacity in tokens (and GiB with a model)."""
    row: dict[str, Any] = result.to_dict()
    blocks = result.capacity_blocks
    row["capacity_tokens"] = None if blocks is None else units.tokens(blocks)
    gib = None if blocks is None else units.gib(blocks)
    row["capacity_gib"] = None if gib is None else round(gib, 6)
    row.setdefault("mode", "sequential")
    return row


def _capacity_cells(blocks: int | None, units: CapacityUnits) -> str:
    """The capacity columns of a row: blocks, tokens, and GiB with a model."""
    if blocks is None:
        cells = f"{'unbounded':>10}  {'':>11}"
        return cells + (f"  {'':>8}" if units.bytes_per_token else "")
    cells = f"{blocks:>10}  {units.tokens(blocks):>11}"
    gib = units.gib(blocks)
    return cells + ("" if gib is None else f"  {gib:>8.2f}")


def _capacity_header(units: CapacityUnits) -> str:
    return f"{'capacity':>10}  {'tokens':>11}" + (f"  {'GiB':>8}" if units.bytes_per_token else "")


def _trace_line(trace: Trace, units: CapacityUnits) -> str:
    kv = f", {units.bytes_per_token:,} KV bytes per token" if units.bytes_per_token else ""
    return (f"{trace.name}: {trace.num_requests} requests, {trace.num_blocks} blocks "
            f"({trace.distinct_ids()} distinct ids), {units.block_tokens} tokens per block{kv}")


def _sequential_table(trace: Trace, results: Sequence[Any], units: CapacityUnits) -> str:
    """The text output of the sequential mode."""
    lines = [
        _trace_line(trace, units),
        f"{_capacity_header(units)}  {'hit_blocks':>10}  {'block_hit':>9}  {'token_hit':>9}  {'evictions':>10}  {'pool_s':>8}",
    ]
    for r in results:
        lines.append(
            f"{_capacity_cells(r.capacity_blocks, units)}  {r.hit_blocks:>10}  {r.block_hit_ratio:>9.4f}  "
            f"{r.token_hit_ratio:>9.4f}  {r.evictions:>10}  {r.seconds:>8.4f}"
        )
    return "\n".join(lines)


def _timed_table(trace: Trace, results: Sequence[TimedResult], units: CapacityUnits, service: ServiceModel) -> str:
    """The text output of the timed mode."""
    lines = [
        _trace_line(trace, units),
        f"timed: prefill {service.prefill_tokens_per_s:g} tokens/s, decode {service.decode_tokens_per_s:g} "
        f"tokens/s per request, at most {service.max_running} running",
        f"{'policy':>8}  {_capacity_header(units)}  {'token_hit':>9}  {'peak_used':>9}  {'peak_run':>8}  "
        f"{'waited':>7}  {'no_room':>7}  {'preempt':>7}  {'p99_wait_s':>10}  {'rejected':>8}",
    ]
    for r in results:
        lines.append(
            f"{r.policy:>8}  {_capacity_cells(r.capacity_blocks, units)}  {r.token_hit_ratio:>9.4f}  "
            f"{r.peak_blocks_in_use:>9}  {r.peak_running:>8}  {r.waited:>7}  {r.waited_for_blocks:>7}  "
            f"{r.preemptions:>7}  {r.p99_wait_s:>10.2f}  {r.rejected:>8}"
        )
    return "\n".join(lines)

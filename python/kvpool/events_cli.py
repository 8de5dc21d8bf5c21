"""``kvpool events``: watch and summarise a KV-event stream, for operators debugging a router.

- ``kvpool events listen ENDPOINT [--replay ENDPOINT] [--json] [--count N] [--seconds S]``:
  subscribe to a vLLM (or kvpool) publisher, fill every gap through the replay socket (and,
  with ``--from SEQ``, first catch up on the buffered batches from SEQ), print one line per batch (or, with ``--json``, one JSON object per batch: ``seq``,
  ``ts``, ``data_parallel_rank``, ``events``), so that ``> FILE`` records the stream;
- ``kvpool events stats FILE``: over such a recording, batches and events by type, blocks
  stored and removed, groups, sequence gaps, and the distinct hashes still cached at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from typing import Any

from kvpool.cli_common import positive_float, positive_int


def add_events(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``events`` subcommand and its ``listen`` and ``stats`` actions."""
    events = commands.add_parser("events", help="listen to a KV-event stream, or summarise a recording")
    actions = events.add_subparsers(dest="action", required=True, metavar="ACTION")
    listen = actions.add_parser("listen", help="subscribe and print (or record) every batch, gaps filled")
    listen.add_argument("endpoint", metavar="ENDPOINT", help="the publisher's PUB endpoint, e.g. tcp://host:5557")
    listen.add_argument("--replay", metavar="ENDPOINT", help="its replay (ROUTER) endpoint, to fill gaps")
    listen.add_argument("--topic", default="", help="topic to subscribe to (default: all)")
    listen.add_argument("--from", dest="start", type=int, default=None, metavar="SEQ",
                        help="first replay every buffered batch from SEQ (needs --replay)")
    listen.add_argument("--json", action="store_true", help="one JSON object per batch (a recording)")
    listen.add_argument("--count", type=positive_int, default=None, metavar="N", help="stop after N batches")
    listen.add_argument("--seconds", type=positive_float, default=None, metavar="S", help="stop after S seconds")
    listen.set_defaults(func=cmd_listen)
    stats = actions.add_parser("stats", help="summarise a recording made with listen --json")
    stats.add_argument("recording", metavar="FILE", help="JSON lines from kvpool events listen --json")
    stats.set_defaults(func=cmd_stats)


def batch_record(seq: int, batch: Any) -> dict[str, Any]:
    """A batch as a JSON-ready dict: its sequence number, timestamp, rank and events."""
    import msgspec

    return {"seq": seq, "ts": batch.ts, "data_parallel_rank": batch.data_parallel_rank,
            "events": msgspec.to_builtins(batch.events)}


def cmd_listen(args: argparse.Namespace) -> int:
    """``kvpool events listen``."""
    from kvpool.cli_common import CliError

    try:
        from kvpool.publisher import EventListener
    except ImportError as exc:  # pyzmq and msgspec are the ``wire`` extra
        raise CliError(f"events listen needs pyzmq and msgspec ({exc}): pip install 'kvpool[wire]'") from None

    if args.start is not None and args.replay is None:
        raise CliError("--from needs --replay")
    import zmq

    try:
        listener = EventListener(args.endpoint, args.replay, topic=args.topic)
    except zmq.ZMQError as exc:
        raise CliError(f"cannot connect to {args.endpoint!r} / {args.replay!r}: {exc}") from None
    if args.start is not None:
        listener.replay_from(args.start)
    deadline = None if args.seconds is None else time.monotonic() + args.seconds
    seen = 0
    try:
        while (args.count is None or seen < args.count) and (deadline is None or time.monotonic() < deadline):
            item = listener.poll(200)
            if item is None:
                continue
            seq, batch = item
            record = batch_record(seq, batch)
            if args.json:
                print(json.dumps(record), flush=True)
            else:
                kinds = Counter(e["type"] for e in record["events"])
                summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
                print(f"seq {seq}  ts {batch.ts:.6f}  rank {batch.data_parallel_rank}  {summary}", flush=True)
            seen += 1
    finally:
        listener.close()
    print(f"{seen} batches, {listener.gaps} gaps, {listener.missed} batches missed (not received and not"
          " replayed)", file=sys.stderr)
    return 0


def record_problem(record: Any) -> str | None:
    """What keeps ``record`` (one parsed line) from being a batch ``listen --json`` wrote, or
    ``None``: an object with an int ``seq`` and a list of ``events``, each an object with a
    str ``type``, an int-or-null ``group_idx`` and a list of ``block_hashes``, ints or the
    base64 strings a stream of ``bytes`` hashes is recorded as."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if isinstance(record.get("seq"), bool) or not isinstance(record.get("seq"), int):
        return "'seq' must be an integer"
    events = record.get("events")
    if not isinstance(events, list):
        return "'events' must be a list"
    for e in events:
        if not isinstance(e, dict) or not isinstance(e.get("type"), str):
            return "each event must be an object with a 'type'"
        group = e.get("group_idx")
        if group is not None and (isinstance(group, bool) or not isinstance(group, int)):
            return "'group_idx' must be an integer or null"
        hashes = e.get("block_hashes", [])
        if not isinstance(hashes, list) or any(isinstance(h, bool) or not isinstance(h, (int, str)) for h in hashes):
            return "'block_hashes' must be a list of integers (or base64 strings)"
    return None


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``kvpool events stats`` prints, as a dict."""
    kinds: Counter[str] = Counter()
    groups: Counter[int] = Counter()
    stored = removed = gaps = 0
    # Keyed by storage tier too: an offloading connector's CPU events share the batches.
    cached: set[tuple[Any, int, Any]] = set()
    last = None
    for r in records:
        if last is not None and r["seq"] != last + 1:
            gaps += 1
        last = r["seq"]
        for e in r["events"]:
            kinds[e["type"]] += 1
            group = e.get("group_idx") or 0
            medium = e.get("medium")
            if e["type"] == "BlockStored":
                stored += len(e["block_hashes"])
                groups[group] += len(e["block_hashes"])
                cached.update((medium, group, h) for h in e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                removed += len(e["block_hashes"])
                cached.difference_update((medium, group, h) for h in e["block_hashes"])
            elif e["type"] == "AllBlocksCleared":
                cached = {c for c in cached if medium is not None and c[0] != medium}
    return {"batches": len(records), "events": dict(sorted(kinds.items())), "blocks_stored": stored,
            "blocks_removed": removed, "blocks_stored_by_group": dict(sorted(groups.items())),
            "sequence_gaps": gaps, "cached_at_end": len(cached),
            "cached_at_end_by_medium": dict(sorted(Counter(
                "unspecified" if medium is None else str(medium) for medium, _, _ in cached).items()))}


def cmd_stats(args: argparse.Namespace) -> int:
    """``kvpool events stats``."""
    from kvpool.cli_common import CliError

    records = []
    try:
        with open(args.recording, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise CliError(f"{args.recording}:{n}: not JSON: {exc.msg}") from None
                    problem = record_problem(record)
                    if problem:
                        raise CliError(f"{args.recording}:{n}: not a recorded batch: {problem}")
                    records.append(record)
    except OSError as exc:
        raise CliError(f"cannot read {args.recording}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CliError(f"{args.recording}: not UTF-8 text") from None
    for key, value in summarise(records).items():
        print(f"{key}: {value}")
    return 0

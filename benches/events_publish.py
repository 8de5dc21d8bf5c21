#!/usr/bin/env python3
"""KV events on the wire: what publishing costs a scheduler step, and a long stream that
arrives whole.

1. ``overhead``: ``KVCacheManager.schedule_step`` on the serving workload with prefix caching
   and events on (100 requests of 700 fresh tokens each step, 16-token blocks: prefill, one
   decode token, free; 4,300 blocks stored a step), the step's events taken each time. Runs
   alternate between taking them as msgpack and dropping them, publishing that msgpack
   (``publish(take_events_msgpack())``), ``publish_from(manager)`` (encoded and held for
   replay in Rust, the payload lent to ZeroMQ from Rust) and the same with pyzmq's copying
   send (``lends_payloads = False``, the publisher before ``kvpool.ZmqSink``); then, in rounds of their own, publishing the event objects
   (``take_events``, converted and encoded in Python). Short runs (``--steps``, default 10)
   in many rounds (``--rounds``, default 101): on these shared machines a step's time drifts
   by 30% from one run to the next, so what counts is each round's ratio between runs back
   to back, every order of the contestants in turn; it prints the medians and the quartiles
   of those paired ratios. The
   subscriber is in the same process (on a 2-core machine its ZeroMQ I/O thread competes with
   the step for the cores); ``--no-subscriber`` leaves it out. The runs share one publisher
   whose replay buffer is filled first (the steady state of an engine that has run a while:
   each batch published lets an old one go); ``--fresh-publisher`` gives each run a publisher
   of its own, so it times the buffer filling, where every payload is fresh memory.
2. ``events-on``: what events cost the step before any publishing: the same workload with
   events off, against events on and taken as msgpack each step, interleaved, paired.
3. ``stream``: ``--events`` events (``BlockStored`` of one block each, 10 per batch) published
   to an ``EventListener`` that reads only every 20,000 batches, with small queues (PUB high
   water mark 1,000, the listener's 64) so that ZeroMQ drops what it cannot deliver; the
   listener fills every gap through replay (a gap at the very end shows when a later batch
   arrives, so a batch follows every 100 ms until the listener has caught up, as in a live
   stream; those are counted as batches, not events). Prints
   how many batches and events arrived, in order, how many gaps replay filled, and the time.

``python benches/events_publish.py [--rounds 101] [--steps 10] [--events 1000000] [--no-subscriber]
[--fresh-publisher [--prefault]] [--buffer-steps 10000] [--buffer-bytes 268435456]``
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import numpy as np

import kvpool
from kvpool.publisher import DEFAULT_BUFFER_BYTES, EventListener, ZmqPublisher


def serving_step(manager: kvpool.KVCacheManager, prompts: list[np.ndarray], step: int) -> None:
    rids = [f"s{step}-{i}" for i in range(len(prompts))]
    for rid, p in zip(rids, prompts):
        manager.add_request(rid, p)
    manager.schedule_step(rids, 700)
    manager.append_token_ids_many(rids, np.ones(len(rids), dtype=np.int64))
    manager.schedule_step(rids, 1)
    manager.free_many(rids)


def fill_replay_buffer(publisher: ZmqPublisher, payload: bytes, buffer_steps: int, buffer_bytes: int) -> int:
    """Publishes copies of ``payload`` (each its own allocation) until the replay buffer is full,
    as it is in an engine that has run for a while: from then on each batch published lets an
    old one go, whose memory the next payload reuses. Returns how many were published."""
    n = 0
    while True:
        stats = publisher.stats()
        if stats.buffered >= buffer_steps or stats.buffered_bytes + len(payload) > buffer_bytes:
            return n
        publisher.publish(bytes(bytearray(payload)))
        n += 1


def overhead(rounds: int, steps: int, subscriber: bool, buffer_steps: int, fresh: bool = False,
             buffer_bytes: int = DEFAULT_BUFFER_BYTES, prefault: bool = False) -> None:
    rng = np.random.default_rng(0)
    publisher = ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=buffer_steps,
                             buffer_bytes=buffer_bytes, group_specs={0: ("full_attention", None)})
    listener = EventListener(publisher.endpoint, publisher.replay_endpoint) if subscriber else None
    time.sleep(0.2)
    filled = 0
    if not fresh:
        # The steady state: a full replay buffer, filled with copies of one step's payload.
        manager = kvpool.KVCacheManager(30_000, 16, enable_events=True)
        serving_step(manager, [rng.integers(1, 50_000, 700) for _ in range(100)], 0)
        filled = fill_replay_buffer(publisher, manager.take_events_msgpack(group_specs={0: ("full_attention", None)}),
                                    buffer_steps, buffer_bytes)
        while listener is not None and listener.poll(100) is not None:
            pass
    names = ("events dropped", "published as bytes", "published from the manager",
             "from the manager, pyzmq copy", "published as objects")
    times: dict[str, list[float]] = {n: [] for n in names}
    blocks = 0

    def run(name: str, workload: list[list[np.ndarray]]) -> float:
        manager = kvpool.KVCacheManager(30_000, 16, enable_events=True)
        # ``fresh``: a publisher of its own per run, so that no run inherits the buffer's
        # payloads (and their memory) from the runs before it.
        pub = ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=buffer_steps,
                           buffer_bytes=buffer_bytes, group_specs={0: ("full_attention", None)},
                           prefault_buffer=prefault) if fresh else publisher
        # The payload lent to ZeroMQ from Rust (the default), or copied by pyzmq's send.
        pub.lends_payloads = name != "from the manager, pyzmq copy"
        t0 = time.perf_counter()
        for s, prompts in enumerate(workload):
            serving_step(manager, prompts, s)
            if name == "events dropped":
                manager.take_events_msgpack(group_specs={0: ("full_attention", None)})
            elif name == "published as bytes":
                pub.publish(manager.take_events_msgpack(group_specs={0: ("full_attention", None)}))
            elif name == "published from the manager":
                pub.publish_from(manager)
            elif name == "from the manager, pyzmq copy":
                pub.publish_from(manager)
            else:
                pub.publish(manager.take_events())
        assert pub.flush(120)
        elapsed = time.perf_counter() - t0  # flushing counted: the thread's work shares the GIL
        while listener is not None and listener.poll(0) is not None:
            pass
        if fresh:
            pub.close()
        return elapsed / steps * 1e6

    # The byte path races the baseline, interleaved; the object path (5x slower, and hundreds of
    # MB of Python objects that would leave the heap and caches cold for the run after it) is
    # timed in rounds of its own, after them.
    for pair in (names[:4], names[4:]):
        for r in range(rounds + 1):
            # Fresh prompts every step, so that every step stores all its blocks (made outside the clock).
            workload = [[rng.integers(1, 50_000, 700) for _ in range(100)] for _ in range(steps)]
            # Every order in turn: the first run of a round is slower (the round's
            # prompts were just made), and a contestant that never runs first (the middle
            # one, were the order only reversed) would look cheaper than it is.
            orders = list(itertools.permutations(pair))
            for name in orders[r % len(orders)]:
                elapsed = run(name, workload)
                if r:
                    times[name].append(elapsed)
        blocks = 100 * 700 // 16
    med = {k: statistics.median(v) for k, v in times.items()}
    where = ("a subscriber in this process over loopback" if subscriber else "no subscriber") + (
        f", replay buffer of {buffer_steps:,} batches / {buffer_bytes / 2**20:,.0f} MiB") + (
        (", a fresh publisher per run, its buffer written at start (prefault_buffer=True)" if prefault
         else ", a fresh publisher per run (the buffer filling)") if fresh
        else f", the buffer full ({filled:,} batches published before the runs)")
    print(f"schedule_step, serving workload, caching and events on ({blocks:,} blocks stored a step), {where}")
    base = times["events dropped"]
    for name, us in med.items():
        extra = ""
        if name != "events dropped":
            paired = [t / b - 1 for t, b in zip(times[name], base)]
            q1, q2, q3 = statistics.quantiles(paired, n=4)
            extra = f"  {q2:+.1%} (paired per round; quartiles {q1:+.1%} to {q3:+.1%})"
        print(f"  {name:<27} {us:9.1f} µs per step{extra}")
    print(f"  (medians of {rounds} interleaved rounds of {steps} steps, each run until its events are sent; "
          f"the baseline still encodes them; publisher: {publisher.stats()})")
    if listener is not None:
        listener.close()
    publisher.close()


def events_on(rounds: int, steps: int) -> None:
    """What events cost the step before any publishing: the serving step with events off,
    against events on and taken as msgpack each step (recorded, encoded, dropped)."""
    rng = np.random.default_rng(0)
    specs = {0: ("full_attention", None)}
    times: dict[str, list[float]] = {"events off": [], "events on, taken as msgpack": []}
    for r in range(rounds + 1):
        workload = [[rng.integers(1, 50_000, 700) for _ in range(100)] for _ in range(steps)]
        for name in (list(times) if r % 2 == 0 else list(times)[::-1]):
            manager = kvpool.KVCacheManager(30_000, 16, enable_events=name != "events off")
            t0 = time.perf_counter()
            for s, prompts in enumerate(workload):
                serving_step(manager, prompts, s)
                if name != "events off":
                    manager.take_events_msgpack(group_specs=specs)
            if r:
                times[name].append((time.perf_counter() - t0) / steps * 1e6)
    off, on = times["events off"], times["events on, taken as msgpack"]
    q1, q2, q3 = statistics.quantiles([b / a - 1 for a, b in zip(off, on)], n=4)
    print(f"schedule_step, serving workload, caching on: events off {statistics.median(off):.1f} µs per step, "
          f"events on and taken as msgpack {statistics.median(on):.1f} µs, {q2:+.1%} "
          f"(paired per round; quartiles {q1:+.1%} to {q3:+.1%}; {rounds} rounds of {steps} steps)")


def stream(num_events: int, per_batch: int = 10) -> None:
    publisher = ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=num_events // per_batch + 1,
                             hwm=1_000)
    listener = EventListener(publisher.endpoint, publisher.replay_endpoint, receive_hwm=64)
    time.sleep(0.2)
    batches = num_events // per_batch
    got = events_seen = 0
    in_order = True

    def take(item: tuple[int, object] | None) -> bool:
        nonlocal got, events_seen, in_order
        if item is None:
            return False
        seq, batch = item
        in_order &= seq == got
        got += 1
        events_seen += len(batch.events)  # type: ignore[attr-defined]
        return True

    t0 = time.perf_counter()
    for b in range(batches):
        events = [kvpool.BlockStored(block_hashes=[(b * per_batch + e).to_bytes(32, "big")], parent_block_hash=None,
                                     token_ids=[1, 2], block_size=2) for e in range(per_batch)]
        publisher.publish(events, ts=float(b))
        if b % 20_000 == 0:  # the consumer lags behind, so ZeroMQ drops batches on the way
            while take(listener.poll(0)):
                pass
    # A gap at the very end shows only when a later batch arrives, as the next batch of a live
    # stream would bring it: while the listener has not caught up, one more batch every 100 ms.
    heartbeats = 0
    deadline = time.monotonic() + 120
    while got < publisher.stats().sent and time.monotonic() < deadline:
        if not take(listener.poll(100)):
            publisher.publish([kvpool.AllBlocksCleared()], ts=float(batches + heartbeats))
            heartbeats += 1
    batches += heartbeats
    events_seen -= heartbeats  # one AllBlocksCleared each
    elapsed = time.perf_counter() - t0
    print(f"stream: {events_seen:,} of {num_events:,} events in {got:,} of {batches:,} batches arrived "
          f"({'in order' if in_order else 'OUT OF ORDER'}), "
          f"{listener.gaps} gaps filled by replay, {elapsed:.1f} s; publisher: {publisher.stats()}")
    listener.close()
    publisher.close()
    if got != batches or not in_order:
        sys.exit(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=101)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--only", choices=("overhead", "stream", "events-on"))
    ap.add_argument("--buffer-steps", type=int, default=10_000,
                    help="the publisher's replay buffer, in batches (vLLM's default)")
    ap.add_argument("--buffer-bytes", type=int, default=DEFAULT_BUFFER_BYTES,
                    help="the publisher's replay buffer, in payload bytes")
    ap.add_argument("--no-subscriber", action="store_true",
                    help="overhead without a subscriber (ZeroMQ then drops the frames at once)")
    ap.add_argument("--fresh-publisher", action="store_true",
                    help="a new publisher for every run (no subscriber): the buffer filling, where every "
                    "payload is fresh memory; by default the runs share one publisher whose buffer is full")
    ap.add_argument("--prefault", action="store_true",
                    help="with --fresh-publisher: each publisher writes its buffer once when built "
                    "(prefault_buffer=True), outside the clock, so that its first lap faults no page in")
    args = ap.parse_args()
    if args.only in (None, "overhead"):
        overhead(args.rounds, args.steps, not (args.no_subscriber or args.fresh_publisher), args.buffer_steps,
                 args.fresh_publisher, args.buffer_bytes, args.prefault)
    if args.only in (None, "events-on"):
        events_on(args.rounds, args.steps)
    if args.only in (None, "stream"):
        stream(args.events)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""KV events on the wire: what publishing costs a scheduler step, and a long stream that
arrives whole.

1. ``overhead``: ``KVCacheManager.schedule_step`` on the serving workload with prefix caching
   and events on (100 requests of 700 tokens, 16-token blocks: prefill, one decode token,
   free; about 4,400 ``BlockStored`` blocks a step), the step's events taken each time. Runs
   alternate between dropping them and ``ZmqPublisher.publish``-ing them (to a PUB socket on
   loopback with a subscriber attached), medians of ``--rounds``; the ratio is what publishing
   adds to the step, conversion and encoding included (they run on the publisher's thread,
   which shares the GIL with the step).
2. ``stream``: ``--events`` events (``BlockStored`` of one block each, 10 per batch) published
   to an ``EventListener`` whose receive queue is kept small (``RCVHWM`` 64) so that the PUB
   socket drops batches it cannot deliver; the listener fills every gap through replay. Prints
   how many batches and events arrived, in order, how many gaps replay filled, and the time.

``python benches/events_publish.py [--rounds 7] [--events 1000000]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import kvpool
from kvpool.publisher import EventListener, ZmqPublisher


def serving_step(manager: kvpool.KVCacheManager, prompts: list[np.ndarray], step: int) -> None:
    rids = [f"s{step}-{i}" for i in range(len(prompts))]
    for rid, p in zip(rids, prompts):
        manager.add_request(rid, p)
    manager.schedule_step(rids, 700)
    manager.append_token_ids_many(rids, np.ones(len(rids), dtype=np.int64))
    manager.schedule_step(rids, 1)
    manager.free_many(rids)


def overhead(rounds: int, steps: int) -> None:
    rng = np.random.default_rng(0)
    publisher = ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=10_000)
    listener = EventListener(publisher.endpoint, publisher.replay_endpoint)
    time.sleep(0.2)
    times: dict[str, list[float]] = {"events dropped": [], "events published": []}
    blocks = 0
    for r in range(rounds + 1):
        for name in (list(times) if r % 2 == 0 else list(times)[::-1]):
            manager = kvpool.KVCacheManager(30_000, 16, enable_events=True)
            prompts = [rng.integers(1, 50_000, 700) for _ in range(100)]  # fresh: every block is stored
            publish = name == "events published"
            t0 = time.perf_counter()
            for s in range(steps):
                serving_step(manager, prompts, s)
                events = manager.take_events()
                if publish:
                    publisher.publish(events)
            elapsed = time.perf_counter() - t0
            if publish:
                publisher.flush(60)
                blocks = sum(len(getattr(e, "block_hashes", ())) for e in events)
            while listener.poll(0) is not None:
                pass
            if r:
                times[name].append(elapsed / steps * 1e6)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"schedule_step, serving workload, caching and events on ({blocks} blocks stored in a step's events)")
    for name, us in med.items():
        print(f"  {name:<18} {us:9.1f} µs per step")
    print(f"  publishing adds {med['events published'] / med['events dropped'] - 1:+.1%} "
          f"(median of {rounds} interleaved rounds of {steps} steps); publisher: {publisher.stats()}")
    listener.close()
    publisher.close()


def stream(num_events: int, per_batch: int = 10) -> None:
    publisher = ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=num_events // per_batch + 1,
                             max_queue_size=num_events // per_batch + 1)
    listener = EventListener(publisher.endpoint, publisher.replay_endpoint)
    import zmq

    listener._sub.setsockopt(zmq.RCVHWM, 64)
    time.sleep(0.2)
    batches = num_events // per_batch
    t0 = time.perf_counter()
    for b in range(batches):
        events = [kvpool.BlockStored(block_hashes=[(b * per_batch + e).to_bytes(32, "big")], parent_block_hash=None,
                                     token_ids=[1, 2], block_size=2) for e in range(per_batch)]
        publisher.publish(events, ts=float(b))
        while (b % 2_000 == 0) and listener.poll(0) is not None:
            pass  # the consumer lags, so batches are dropped on the wire
    got, events_seen, expected = 0, 0, 0
    while got < batches:
        item = listener.poll(2_000)
        if item is None:
            break
        seq, batch = item
        if seq != expected:
            break
        expected += 1
        got += 1
        events_seen += len(batch.events)
    elapsed = time.perf_counter() - t0
    print(f"stream: {events_seen:,} of {num_events:,} events in {got:,} of {batches:,} batches arrived in order, "
          f"{listener.gaps} gaps filled by replay, {elapsed:.1f} s; publisher: {publisher.stats()}")
    listener.close()
    publisher.close()
    if got != batches:
        sys.exit(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--only", choices=("overhead", "stream"))
    args = ap.parse_args()
    if args.only in (None, "overhead"):
        overhead(args.rounds, args.steps)
    if args.only in (None, "stream"):
        stream(args.events)
    return 0


if __name__ == "__main__":
    sys.exit(main())

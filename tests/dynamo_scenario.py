"""Run by ``test_dynamo_indexer.py`` inside a private network namespace: Dynamo's standalone
KV indexer (``python -m dynamo.indexer``, ai-dynamo-runtime 1.6.1) against three kvpool
managers publishing over ZeroMQ. After each phase every probe's indexer score must equal each
manager's own longest prefix hit, in tokens. Prints one JSON line per phase and exits non-zero
at the first difference."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.request
from typing import Any

import kvpool
from kvpool.publisher import ZmqPublisher

BS, PORT = 16, 8090


def http(method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read() or b"null")


class Worker:
    def __init__(self, wid: int, port: int, num_blocks: int) -> None:
        self.id = wid
        self.manager = kvpool.KVCacheManager(num_blocks, BS, enable_events=True)
        self.pub = ZmqPublisher(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}")
        self.endpoints = (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}")
        self.n = 0

    def register(self) -> None:
        http("POST", "/register", {"instance_id": self.id, "endpoint": self.endpoints[0], "model_name": "m",
                                   "block_size": BS, "replay_endpoint": self.endpoints[1]})

    def serve(self, prompt: list[int]) -> None:
        rid = f"w{self.id}-{self.n}"
        self.n += 1
        m = self.manager
        m.add_request(rid, prompt)
        blocks, hit = m.get_computed_blocks(rid)
        assert m.allocate_slots(rid, len(prompt) - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks) is not None
        m.free(rid)
        self.pub.publish(m.take_events())

    def hit(self, tokens: list[int]) -> int:
        m = self.manager
        m.add_request("probe", tokens + [0])  # the cap of num_tokens - 1 then never binds
        n = m.get_computed_blocks("probe")[1]
        m.free("probe")
        return n


def check(phase: str, workers: list[Worker], probes: list[list[int]], timeout: float = 15.0) -> int:
    for w in workers:
        assert w.pub.flush()
    deadline = time.monotonic() + timeout
    while True:
        want = [{str(w.id): w.hit(p) for w in workers} for p in probes]
        got = []
        for p in probes:
            scores = http("POST", "/query", {"token_ids": p, "model_name": "m"})["scores"]
            got.append({str(w.id): int(scores.get(str(w.id), {}).get("0", 0)) for w in workers})
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    print(json.dumps({"phase": phase, "probes": len(probes), "equal": got == want,
                      "hit_tokens": sum(v for row in want for v in row.values()),
                      "want": want if got != want else None, "got": got if got != want else None}), flush=True)
    if got != want:
        sys.exit(1)
    return sum(v for row in want for v in row.values())


def main() -> int:
    rng = random.Random(0)
    indexer = subprocess.Popen([sys.executable, "-m", "dynamo.indexer", "--port", str(PORT), "--block-size", str(BS)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                http("GET", "/workers")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        a, b, c = Worker(1, 5557, 64), Worker(2, 5567, 64), Worker(3, 5577, 64)
        for w in (a, b):
            w.register()
        time.sleep(0.5)
        shared = [rng.randrange(30_000) for _ in range(3 * BS)]
        other = [rng.randrange(30_000) for _ in range(2 * BS)]
        prompts = [shared + [rng.randrange(30_000) for _ in range(rng.randint(1, 3 * BS))] for _ in range(6)]
        for p in prompts[:4]:
            a.serve(p)
        for p in prompts[3:] + [other + [1] * BS]:
            b.serve(p)
        probes = [p[:k] for p in prompts + [other + [1] * BS] for k in (BS, 3 * BS, len(p))]
        before = check("shared prefixes", [a, b], probes)
        for _ in range(20):  # A's 64-block pool evicts the older prefixes
            a.serve([rng.randrange(30_000) for _ in range(4 * BS)])
        if check("evictions", [a, b], probes) >= before:
            sys.exit("the evictions phase evicted nothing the probes see")
        assert b.manager.reset_prefix_cache()
        b.pub.publish(b.manager.take_events())
        check("prefix-cache reset", [a, b], probes)
        for p in prompts[:3]:  # C publishes before the indexer knows it: a late joiner
            c.serve(p)
        c.register()
        time.sleep(0.5)  # its subscription to C settles; C's first three batches predate it
        c.serve([rng.randrange(30_000) for _ in range(3 * BS)])  # the first batch it sees is seq 3
        check("late joiner", [a, b, c], probes)
        a.pub.lose_on_the_wire.add(a.pub.stats().sent)  # the next batch never reaches the indexer directly
        lost, after = ([rng.randrange(30_000) for _ in range(2 * BS)] for _ in range(2))
        a.serve(lost)
        a.serve(after)  # arrives with a gap before it: the indexer replays the lost batch
        if check("sequence gap", [a, b, c], probes + [lost[:BS], lost, after]) == 0:
            sys.exit("the gap phase cached nothing")
        assert a.pub.stats().replays >= 1
        for w in (a, b, c):
            w.pub.close()
        return 0
    finally:
        indexer.terminate()
        indexer.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())

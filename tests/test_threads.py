"""Threads and re-entrancy: no deadlock, no lost update, no lock held while Python code runs.

Each scenario runs in a subprocess under a timeout, so a deadlock fails the test instead of
hanging the run. ``KVPOOL_THREAD_SECONDS`` sets how long the hammering runs (default 3 s;
``KVPOOL_THREAD_SECONDS=60 python -m pytest tests/test_threads.py`` is the long version).

The scenarios, written as scripts:

* ``HAMMER``: four threads share one ``BlockPool``, one ``KVCacheManager`` (prefix caching on,
  prompts of 9,000-12,000 tokens, so ``add_request`` hashes with the GIL released), one
  ``BlockHasher`` (prompts over 4,096 tokens and ``hash_tokens_many``, also GIL-released) and
  one ``ComputedBlocksTracker``, and the hybrid-model classes (``GroupTables`` on the same
  pool, also one group at a time with ids whose reading calls back into kvpool, a
  ``GroupManager``, ``VllmGroupCalls`` reading a Request whose properties call back into
  kvpool); they mix valid calls with invalid ones (double frees, bad ids,
  unknown requests, wrong dtypes), each of which must raise a ``KVPoolError``. Afterwards every
  structure checks its invariants, every thread got back what it owned (all blocks free), and
  the hashes computed concurrently equal those computed alone.
* ``REENTRANT``: Python code that kvpool runs calls back into the same object: an
  ``__index__`` in a token list calls the hasher that is converting it, a generator of block
  ids calls the pool, and a garbage-collector callback (collections forced on nearly every
  allocation) calls the manager, the pool and a hash list while they build their results.
  Converting before locking and building results after unlocking makes all of them work.
* ``POLICIES``: four threads share an ``adaptive`` pool, a ``priority`` pool on a manual clock
  and a ``priority`` manager: they cache with priorities and durations, raise priorities, pin
  and unpin prefixes (over the budget must raise ``PinBudgetError`` and pin nothing), advance
  the clock, pin prompts and admit prioritized requests. Afterwards every pin is released,
  every block is free again and the invariants hold.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SECONDS = float(os.environ.get("KVPOOL_THREAD_SECONDS", "3"))
TIMEOUT = 120 + 2 * SECONDS

EXPECT = """
def expect(error, call):
    \"\"\"Runs ``call``; anything but ``error`` raised (or nothing) goes to ``unexpected``.\"\"\"
    try:
        call()
    except error:
        return
    except BaseException as e:  # noqa: BLE001
        unexpected.append(f"{type(e).__name__}: {e}")
        return
    unexpected.append(f"no {error.__name__} from {call}")


def run_workers(worker, n=4):
    \"\"\"Runs ``worker(k)`` on ``n`` threads at once; none may record an error.\"\"\"
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not unexpected, unexpected[:5]
"""
"""What the thread scripts share: the check of a call that must fail, and running the
workers (each script defines ``errors`` and ``unexpected``, and imports ``threading``)."""

HAMMER = EXPECT + """
import random, sys, threading, time
import numpy as np
import kvpool

SECONDS = float(sys.argv[1])
pool = kvpool.BlockPool(4096, block_size=16)
manager = kvpool.KVCacheManager(8192, 16, enable_caching=True)
hasher = kvpool.BlockHasher(16, hash_algo="sha256_cbor")
tracker = kvpool.ComputedBlocksTracker(pool, 16)
tables = kvpool.BlockTables(pool, max_model_len=1 << 20)   # shares the pool too
LONG = [list(range(k * 7, k * 7 + 9000 + 1000 * k)) for k in range(4)]
EXPECTED = [hasher.hash_tokens(p).to_list() for p in LONG]
# Short lists are hashed reading their ints in place, the hasher's lock held.
SHORT = [[(t * 7919 + k) % 150_000 for t in range(700 + 50 * k)] for k in range(4)]
EXPECTED_SHORT = [hasher.hash_tokens(np.array(p)).to_list() for p in SHORT]
SHARED = list(range(1000))  # changed by the threads while they hash it
errors, unexpected = [], []
deadline = time.monotonic() + SECONDS


class Req:
    # A vLLM Request's fields; reading num_tokens runs Python that calls back into kvpool,
    # so a call that read it under a kvpool lock would deadlock.

    def __init__(self, request_id, block_hashes):
        self.request_id, self.block_hashes = request_id, block_hashes
        self.num_computed_tokens, self.n, self.skip_reading_prefix_cache = 0, 50, False
        self.num_in_flight_tokens, self.shared_prefix_boundary = 0, 0

    @property
    def num_tokens(self):
        tables.request_ids(), pool.get_usage()
        return self.n

    @property
    def num_prompt_tokens(self):
        gtables.request_ids(), gmanager.get_usage()
        return 50


def blocks_of(pool_, ids):
    # kvpool calls this to build its results: after unlocking, or it would deadlock.
    tables.request_ids()
    return ids


EMPTY = ()
calls = kvpool.VllmManagerCalls(tables, EMPTY, blocks_of, list, (), 0)
# The hybrid model's tables (on the same pool), manager and vLLM calls.
gtables = kvpool.GroupTables(pool, ["full", ("sliding_window", 32)], max_model_len=1 << 20)
gmanager = kvpool.GroupManager(8192, 16, ["full", ("sliding_window", 64)])


def groups_of(pool_, groups):
    # Built after unlocking, or it would deadlock.
    tables.request_ids()
    return groups


gcalls = kvpool.VllmGroupCalls(gtables, EMPTY, groups_of, lambda b: [list(g) for g in b], (), 0)


class CallingBackIds:
    # Block ids whose reading calls kvpool: converted before kvpool locks, or it would
    # deadlock.

    def __init__(self, ids):
        self.ids = list(ids)

    def __len__(self):
        gtables.request_ids()
        return len(self.ids)

    def __iter__(self):
        gtables.request_ids()
        return iter(self.ids)

    def __getitem__(self, i):
        gtables.request_ids()
        return self.ids[i]


def worker(k):
    rng = random.Random(k)
    n = 0
    try:
        while time.monotonic() < deadline:
            # The pool: allocate, cache, look up, free; and bad calls.
            ids = pool.get_new_blocks(rng.randrange(1, 40))
            hashes = [bytes([k]) + n.to_bytes(4, "big") + i.to_bytes(2, "big") + bytes(25)
                      for i in range(len(ids))]
            pool.cache_full_blocks(ids, hashes, 0, len(ids))
            assert (pool.find_longest_cache_hit(hashes) == ids).all()
            pool.free_blocks(ids, reverse=rng.random() < 0.5)
            expect(kvpool.KVPoolError, lambda: pool.free_blocks(ids))               # double free
            expect(kvpool.KVPoolError, lambda: pool.touch([4096 + k]))              # out of range
            expect(kvpool.KVPoolError, lambda: pool.free_blocks(np.array([1.5])))   # dtype
            # The manager: long prompts (hashed with the GIL released), prefill, free.
            rid = f"r{k}-{n}"
            manager.add_request(rid, LONG[k])
            hits, n_hit = manager.get_computed_blocks(rid)
            blocks = manager.allocate_slots(rid, len(LONG[k]) - n_hit,
                                            num_new_computed_tokens=n_hit, new_computed_blocks=hits)
            assert blocks is not None
            manager.free(rid)
            expect(kvpool.KVPoolError, lambda: manager.free(rid))                   # unknown request
            expect(kvpool.KVPoolError, lambda: manager.add_request(rid + "x", "text"))
            # The hasher: long prompts and batches, compared with the hashes made alone.
            assert hasher.hash_tokens(LONG[k]).to_list() == EXPECTED[k]
            assert hasher.hash_tokens(SHORT[k]).to_list() == EXPECTED_SHORT[k]
            start = n % (len(EXPECTED_SHORT[k]) + 1)
            parent = EXPECTED_SHORT[k][start - 1] if start else None
            assert hasher.hash_blocks_from(parent, SHORT[k], start) == EXPECTED_SHORT[k][start:]
            # A list other threads change between calls: each call sees one state of it.
            SHARED.append(n)
            SHARED.pop(0)
            hashes = hasher.hash_tokens(SHARED).to_list()
            assert len(hashes) in (62, 63)
            batch = hasher.hash_tokens_many([LONG[k], LONG[(k + 1) % 4]])
            assert batch[1].to_list() == EXPECTED[(k + 1) % 4]
            # The tracker reads the shared pool.
            sid = f"s{k}-{n}"
            tracker.add_sequence(sid, LONG[k][:600])
            tracker.get_num_cached_tokens(sid)
            tracker.remove_sequence(sid)
            # The caller-owned block tables, on the same pool: a prefill, a decode, free.
            tid = f"t{k}-{n}"
            t_hashes = [bytes([k + 100]) + n.to_bytes(4, "big") + i.to_bytes(2, "big") + bytes(25)
                        for i in range(3)]
            assert tables.allocate_slots(tid, 0, 50, t_hashes, 50) is not None
            tables.allocate_slots(tid, 50, 51, t_hashes, 1)
            expect(kvpool.KVPoolError, lambda: tables.allocate_slots(tid, 51, 52, t_hashes, True))
            tables.free(tid)
            # vLLM's per-request calls, reading a Request whose properties call back.
            req = Req(f"v{k}-{n}", [bytes([k + 200]) + n.to_bytes(4, "big") + i.to_bytes(2, "big") + bytes(25)
                                    for i in range(3)])
            got = calls.allocate_slots(req, 50)
            assert len(got) == 4 and (calls.get_blocks(req.request_id) == got).all()
            req.num_computed_tokens, req.n = 50, 51
            assert calls.allocate_slots(req, 1, num_lookahead_tokens=0) is EMPTY
            hit, hit_tokens, _ = calls.get_computed_blocks(req)
            assert hit_tokens == 48 and (hit == got[:3]).all()
            assert calls.estimate_cached_tokens(req) == 48
            calls.free(req)
            expect(kvpool.KVPoolError, lambda: calls.free(object()))
            # A hybrid model's tables on the shared pool: prefill, window frees, free.
            gid = f"g{k}-{n}"
            g_hashes = [bytes([k + 50]) + n.to_bytes(4, "big") + i.to_bytes(2, "big") + bytes(25) for i in range(4)]
            got = gtables.allocate_slots(gid, 0, 64, 64, g_hashes, 64)
            assert got is not None and [len(g) for g in got] == [4, 4]
            gtables.remove_skipped_blocks(gid, 64)
            expect(kvpool.KVPoolError, lambda: gtables.allocate_slots(gid, 64, 64, 64, g_hashes, 0))
            gtables.free(gid)
            # The same tables one group at a time (vLLM's per-type managers' calls): count,
            # allocate, window frees, pop the tables unfreed and hand them to another request.
            sid = f"p{k}-{n}"
            assert gtables.group_num_blocks_to_allocate(sid, 1, 64, CallingBackIds([]), 0, 0) == 4
            assert len(gtables.group_allocate_new_blocks(sid, 0, 64)) == 4 and sid in gtables
            gtables.group_allocate_new_blocks(sid, 1, 64)
            gtables.remove_skipped_blocks(sid, 64)
            expect(kvpool.KVPoolError, lambda: gtables.group_adopt_blocks(sid, 0, CallingBackIds([1])))
            loose = [i for g in gtables.pop_tables(sid) for i in g.tolist() if i != 0]
            assert len(loose) == 6 and sid not in gtables
            gtables.group_adopt_blocks(f"P{k}-{n}", 0, CallingBackIds(loose))
            gtables.free(f"P{k}-{n}")
            assert kvpool.find_group_hit(pool, ("sliding_window", 32), g_hashes, 64)[1] == 64
            # The hybrid manager, on long prompts the threads share (hits across threads).
            mid = f"m{k}-{n}"
            gmanager.add_request(mid, LONG[k][:2000])
            hits, n_hit = gmanager.get_computed_blocks(mid)
            adopt = hits if any(len(h) for h in hits) else None
            assert gmanager.allocate_slots(mid, 2000 - n_hit, num_new_computed_tokens=n_hit,
                                           new_computed_blocks=adopt) is not None
            gmanager.free(mid)
            # vLLM's hybrid per-request calls, reading a Request whose properties call back.
            greq = Req(f"h{k}-{n}", [bytes([k + 150]) + n.to_bytes(4, "big") + i.to_bytes(2, "big") + bytes(25)
                                     for i in range(3)])
            got = gcalls.allocate_slots(greq, 50)
            assert len(got) == 2 and [len(g) for g in got] == [4, 4]
            gcalls.free(greq)
            n += 1
    except BaseException as e:  # noqa: BLE001
        errors.append(f"thread {k}: {type(e).__name__}: {e}")


run_workers(worker)
pool.check_invariants()
tables.check_invariants()
manager.check_invariants()
assert len(tables.request_ids()) == 0
assert pool.get_num_free_blocks() == 4095, pool.get_num_free_blocks()
assert manager.get_num_free_blocks() == 8191 and len(manager) == 0
assert len(tracker) == 0
gtables.check_invariants()
gmanager.check_invariants()
assert len(gtables.request_ids()) == 0 and len(gmanager) == 0
assert gmanager.get_num_free_blocks() == 8191
print("ok")
"""

REENTRANT = """
import gc
import numpy as np
import kvpool

hasher = kvpool.BlockHasher(16)
pool = kvpool.BlockPool(64, block_size=16)
manager = kvpool.KVCacheManager(64, 4, enable_caching=True)
for i in range(8):
    manager.add_request(f"r{i}", [1, 2, 3, 4, 5, i])


class CallsBack:
    # An int whose __index__ calls the hasher that is converting it.
    def __init__(self, v):
        self.v = v

    def __index__(self):
        hasher.hash_tokens(list(range(40)))
        return self.v


tokens = [CallsBack(t) for t in range(48)]
assert hasher.hash_tokens(tokens).to_list() == hasher.hash_tokens(list(range(48))).to_list()


def ids_calling_the_pool():
    for i in pool.get_new_blocks(3):
        pool.get_num_free_blocks()
        yield int(i)


pool.free_blocks(ids_calling_the_pool())
assert pool.get_num_free_blocks() == 63
hashes = hasher.hash_tokens(list(range(64)))

calls = []


def on_gc(phase, info):
    # Runs inside whatever allocation started the collection: maybe while kvpool builds a
    # result. Every call must get its lock.
    calls.append((manager.get_num_free_blocks(), pool.get_usage(), len(hashes), len(manager)))


gc.callbacks.append(on_gc)
gc.set_threshold(1, 1, 1)
try:
    for _ in range(300):
        manager.request_ids()
        manager.take_events()
        manager.get_block_ids("r1")
        manager.prefix_cache_stats
        pool.free_block_ids()
        pool.take_events()
        hashes.to_list()
        hashes[1:3]
        hashes == hashes.to_list()
        hasher.hash_tokens(list(range(40)))
finally:
    gc.set_threshold(700, 10, 10)
    gc.callbacks.remove(on_gc)
assert calls, "the collector never ran"
print("ok", len(calls))
"""


POLICIES = EXPECT + """
import random, sys, threading, time
import kvpool

SECONDS = float(sys.argv[1])
adaptive = kvpool.BlockPool(2048, block_size=16, eviction="adaptive")
priority = kvpool.BlockPool(2048, block_size=16, eviction="priority", clock="manual", max_pinned_blocks=64)
manager = kvpool.KVCacheManager(4096, 16, eviction="priority", clock="manual", max_pinned_blocks=256)
SYSTEM = list(range(16 * 8))                       # an 8-block system prompt, pinned by every thread
errors, unexpected = [], []
deadline = time.monotonic() + SECONDS


def worker(k):
    rng = random.Random(k)
    n = 0
    try:
        while time.monotonic() < deadline:
            for pool in (adaptive, priority):
                ids = pool.get_new_blocks(rng.randrange(1, 24))
                hashes = [bytes([k]) + n.to_bytes(4, "big") + i.to_bytes(2, "big") + bytes(25) for i in range(len(ids))]
                if pool is priority:
                    pool.cache_full_blocks(ids, hashes, 0, len(ids), priority=rng.randrange(0, 101),
                                           retention_s=rng.choice([None, 0.5, 5.0]))
                    pool.set_priority(ids[:1], 90, retention_s=1.0)
                else:
                    pool.cache_full_blocks(ids, hashes, 0, len(ids))
                # Pin the chain's head while the blocks are held (no other thread can evict
                # them), free them, then unpin: the pin kept its own reference meanwhile.
                assert pool.pin_prefix(hashes[:4]) == min(4, len(ids))
                pool.free_blocks(ids, reverse=True)
                assert pool.unpin_prefix(hashes[:4]) == min(4, len(ids))
                expect(kvpool.KVPoolError, lambda: pool.set_priority([2048 + k], 10))
            # Over the budget (64): an error, and nothing pinned.
            big = priority.get_new_blocks(70)
            big_hashes = [bytes([k + 50]) + n.to_bytes(4, "big") + i.to_bytes(2, "big") + bytes(25) for i in range(70)]
            priority.cache_full_blocks(big, big_hashes, 0, 70)
            expect(kvpool.PinBudgetError, lambda: priority.pin_prefix(big_hashes))
            priority.free_blocks(big, reverse=True)
            priority.advance_clock(rng.random())
            # The manager: the shared system prompt pinned, prioritized requests that hit it.
            manager.pin_prompt(SYSTEM)
            rid = f"r{k}-{n}"
            manager.add_request(rid, SYSTEM + [1000 * k + n % 997, 7, 8], priority=rng.randrange(0, 101),
                                retention_s=rng.choice([None, 2.0]))
            hits, n_hit = manager.get_computed_blocks(rid)
            assert manager.allocate_slots(rid, len(SYSTEM) + 3 - n_hit, num_new_computed_tokens=n_hit,
                                          new_computed_blocks=hits) is not None
            manager.free(rid)
            manager.unpin_prompt(SYSTEM)
            manager.advance_clock(0.01)
            n += 1
    except BaseException as e:  # noqa: BLE001
        errors.append(f"thread {k}: {type(e).__name__}: {e}")


run_workers(worker)
for pool in (adaptive, priority):
    pool.check_invariants()
    assert pool.get_num_pinned_blocks() == 0 and pool.get_num_free_blocks() == 2047
manager.check_invariants()
assert manager.get_num_pinned_blocks() == 0 and manager.get_num_free_blocks() == 4095 and len(manager) == 0
print("ok")
"""


def run_script(script: str, *args: str) -> str:
    """The script's output; fails the test on an error or when it hangs past ``TIMEOUT``."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script), *args],
            capture_output=True, text=True, timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        result = None
    if result is None:
        pytest.fail(f"deadlock: the script did not finish within {TIMEOUT:.0f} s", pytrace=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_threads_share_every_class_without_deadlock_or_lost_updates() -> None:
    assert run_script(HAMMER, str(SECONDS)).strip() == "ok"


def test_python_code_run_by_kvpool_may_call_back_into_it() -> None:
    assert run_script(REENTRANT).startswith("ok")


def test_threads_share_the_eviction_policies_pins_and_priorities() -> None:
    assert run_script(POLICIES, str(SECONDS)).strip() == "ok"


BORROWED_WHILE_WAITING = """
import threading, time
import numpy as np
import kvpool

hasher = kvpool.BlockHasher(16, hash_algo="sha256")
big = np.arange(4_000_000, dtype=np.int64) % 1000
small = np.arange(4000, dtype=np.int64)
expected = hasher.hash_tokens(small.copy())
got = []
holder = threading.Thread(target=lambda: hasher.hash_tokens(big))
holder.start()
time.sleep(0.005)
waiter = threading.Thread(target=lambda: got.append(hasher.hash_tokens(small)))
waiter.start()
time.sleep(0.002)
small.resize(0, refcheck=False)  # the array the waiter was given shrinks under it
holder.join()
waiter.join()
print("ok" if got[0] == expected else "changed")
"""


def test_an_array_borrowed_by_a_call_that_waits_for_a_lock_is_copied_first() -> None:
    """A small int64 array is read in place, which is only safe while the GIL is kept; a call
    that has to wait for the hasher (and so gives the GIL up) hashes a copy: the array may
    change or shrink meanwhile without changing the answer or aborting the process."""
    for _ in range(3):
        assert run_script(BORROWED_WHILE_WAITING).strip() == "ok"


def test_ids_lent_to_cache_full_blocks_are_borrowed_after_the_other_arguments() -> None:
    """``cache_full_blocks`` reads an int32 id array in place; the hashes are converted
    first, and converting them may run Python code that resizes the array (a generator
    here). The call reads the array as it is after that, never freed memory: before, it
    cached the blocks of another array that numpy had put in the freed room."""
    import numpy as np

    import kvpool

    pool = kvpool.BlockPool(16, block_size=4)
    first, second = pool.get_new_blocks(4), pool.get_new_blocks(4)
    ids = np.array(first, dtype=np.int32)
    keep = []

    def hashes():
        yield bytes(31) + b"\x01"
        ids.resize(1000, refcheck=False)  # new memory, the first 4 ids copied; the old freed
        keep.append(np.array(second, dtype=np.int32))  # likely to land in the freed room
        for i in range(2, 5):
            yield bytes(31) + bytes([i])

    pool.cache_full_blocks(ids, hashes(), 0, 4)
    assert [i for i in range(16) if pool.block_hash(i) is not None] == sorted(first.tolist())
    pool.check_invariants()


STEP_RESULT_FROM_GC = """
import faulthandler, gc
import kvpool
faulthandler.dump_traceback_later(20, exit=True)
manager = kvpool.KVCacheManager(64, 4)
manager.add_request("r", list(range(10)))
current = []
gc.callbacks.append(lambda phase, info: current and (current[0].offsets, current[0].status))
gc.set_threshold(1)
for _ in range(300):
    result = manager.schedule_step(["r"], 10)
    current[:] = [result]
    assert len(result.offsets) == 2 and result.status.tolist() == [0]
    manager.preempt("r")
gc.callbacks.clear()
print("ok")
"""


def test_step_result_arrays_may_be_read_from_code_their_creation_runs() -> None:
    """A ``StepResult`` builds each array on first read; building it can start the garbage
    collector, whose callbacks may read the same property. The array is now built outside
    the result's once-cell (before, the nested read deadlocked on the cell)."""
    assert run_script(STEP_RESULT_FROM_GC).strip() == "ok"


RING_REFUSES_MEANWHILE = """
import sys, threading, zmq
import kvpool

send = sys.argv[1] == "send"
if send:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.bind("inproc://ring")
    sink = kvpool.ZmqSink(sock, b"kv")
refused = 0
for trial in range(100):
    pool = kvpool.BlockPool(4096, block_size=16, enable_events=True, max_pending_events=100_000)
    ids = pool.get_new_blocks(4000)
    for i in range(4000):
        pool.cache_full_blocks(ids[i:i + 1], [i.to_bytes(32, "big")], 0, 1)
    expected = pool.num_pending_events
    ring = kvpool.ReplayRing(8, 1 << 24)
    if trial % 2:
        meddle = ring.close
    else:
        meddle = lambda: ring.append(5, b"x")
    def meddler():
        while pool.num_pending_events:  # the call took the events and gave up the GIL
            pass
        meddle()
    thread = threading.Thread(target=meddler)
    thread.start()
    try:
        if send:
            pool.send_events(sink, 1, replay=ring)
        else:
            pool.take_events_msgpack(replay=ring, seq=1)
    except kvpool.KVPoolError:
        refused += 1
        # Refused after the events were taken: they are queued again, all of them.
        assert pool.num_pending_events == expected, (pool.num_pending_events, expected)
    else:
        assert pool.num_pending_events == 0 and 1 in [s for s, _ in ring.batches_from(0)]
    thread.join()
print("ok", refused)
"""


@pytest.mark.parametrize("how", ["take", "send"])
def test_events_go_back_when_the_replay_ring_refuses_them_after_they_are_taken(how: str) -> None:
    """``take_events_msgpack(replay=)`` and ``send_events(replay=)`` check the ring before
    taking the events, but another thread may close it or hold a later batch while the
    call encodes (the GIL released); the events then go back to the queue instead of
    being lost (before, 20% of such races dropped every event)."""
    out = run_script(RING_REFUSES_MEANWHILE, how).split()
    assert out[0] == "ok", out


FIRST_NUMPY_LOOKUP = """
import builtins, threading
import kvpool

pools = [kvpool.BlockPool(64) for _ in range(4)]
real_import = builtins.__import__
looked_up = []


def calling_back(name, *args, **kwargs):
    # Looking numpy's C API up imports numpy's multiarray module through ``__import__``:
    # Python code, which may call kvpool on this thread.
    if "multiarray" in name and not looked_up:
        looked_up.append(name)
        pools[0].free_blocks(pools[0].get_new_blocks(2))
    return real_import(name, *args, **kwargs)


builtins.__import__ = calling_back
pools[0].free_blocks(pools[0].get_new_blocks(1))
builtins.__import__ = real_import


def work(k):
    for _ in range(200):
        for pool in pools:
            pool.free_blocks(pool.get_new_blocks(1 + k))


threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("ok", looked_up)
"""


def test_first_array_is_made_without_waiting_on_numpy_with_the_gil_held() -> None:
    """Looking numpy's ``int32`` dtype up for the first time releases the GIL inside
    numpy's own once-cell (and imports through ``__import__``). The dtype was kept in a
    ``std`` once-cell, so a second thread (or the import's Python code) asking for it with
    the GIL held deadlocked with the first (`POLICIES` hung about once in twenty runs).
    The dtype is now looked up when kvpool is imported, into a GIL-aware cell: the first
    id array any call makes waits on nothing."""
    assert run_script(FIRST_NUMPY_LOOKUP).strip() == "ok []"

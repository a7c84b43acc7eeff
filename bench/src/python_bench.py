"""The Python side of `granary bench python` (written to a temporary file and run by the benchmark).

argv: socket, dataset, batch_size, seed. Reads commands on stdin, one per line, and answers each with
one JSON line on stdout (a jagged tensor, granary.Jagged, is its offsets and values arrays):
  python E       epoch E through granary.Loader: every batch's arrays made (views, no copy), nothing else
  python_copy E  epoch E through granary.Loader, every array copied into a preallocated staging dict
  load_copy E    epoch E's batches copied into RAM as numpy arrays (untimed set-up of numpy_copy)
  numpy_copy E   the batches load_copy kept, each copied into the same staging: no loader can feed faster
  checksums E    epoch E's batch checksums (to compare with the Rust client's)
  ready E        the binding's own cost: a loader 32 batches ahead is given time to fill its queue, then
                 each of 32 ready batches is taken (next()) and its arrays made; the median microseconds
"""

import json
import sys
import time

import numpy as np

import granary

socket, dataset, batch_size, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
loader = granary.Loader(socket, dataset, batch_size, seed=seed)
staging = {}
kept = []


def parts(arr):
    """The arrays of one tensor: a dense tensor's, or a jagged tensor's offsets and values."""
    if isinstance(arr, granary.Jagged):
        return (arr.offsets, arr.values)
    return (arr,)


def stage(key, arr):
    """Copies ``arr`` into the front of a staging buffer kept for ``key`` (grown when too small: a
    jagged tensor's values vary in size from batch to batch)."""
    flat = arr.reshape(-1)
    dst = staging.get(key)
    if dst is None or dst.dtype != flat.dtype or len(dst) < len(flat):
        dst = staging[key] = np.empty(max(len(flat), 0 if dst is None else 2 * len(dst)), dtype=flat.dtype)
    np.copyto(dst[: len(flat)], flat)


def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    cmd, epoch = line.split()
    epoch = int(epoch)
    rows = nbytes = 0
    start = time.perf_counter()
    if cmd == "python":
        for batch in loader.epoch(epoch):
            for arr in batch.values():
                nbytes += arr.nbytes
            rows += batch.rows
    elif cmd == "python_copy":
        for batch in loader.epoch(epoch):
            for name, arr in batch.items():
                for k, part in enumerate(parts(arr)):
                    stage((name, k), part)
                    nbytes += part.nbytes
            rows += batch.rows
    elif cmd == "load_copy":
        kept = [
            (b.rows, {name: tuple(p.copy() for p in parts(arr)) for name, arr in b.items()}) for b in loader.epoch(epoch)
        ]
    elif cmd == "numpy_copy":
        for n, b in kept:
            for name, ps in b.items():
                for k, part in enumerate(ps):
                    stage((name, k), part)
                    nbytes += part.nbytes
            rows += n
    elif cmd == "ready":
        ahead = granary.Loader(socket, dataset, batch_size, seed=seed, prefetch_batches=32)
        it = ahead.epoch(epoch)
        time.sleep(1.0)
        costs = []
        for _ in range(min(32, len(it))):
            t0 = time.perf_counter()
            batch = next(it)
            for arr in batch.values():
                nbytes += arr.nbytes
            costs.append(time.perf_counter() - t0)
        del it, ahead
        costs.sort()
        say(scenario=cmd, epoch=epoch, us=costs[len(costs) // 2] * 1e6)
        continue
    elif cmd == "checksums":
        say(scenario=cmd, epoch=epoch, checksums=[b.checksum() for b in loader.epoch(epoch)])
        continue
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    say(scenario=cmd, epoch=epoch, rows=rows, bytes=nbytes, secs=time.perf_counter() - start)

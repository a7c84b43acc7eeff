"""granary.Loader against a real node: the Rust client's bytes, zero copies, buffer lifetime, resume,
ranks as processes, errors, fork."""

import gc
import json
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest

import granary

from conftest import ROWS


def loader(node, batch_size=1000, **kw):
    args = dict(seed=7, rank=0, world_size=1)
    args.update(kw)
    return granary.Loader(str(node.socket), "ads", batch_size, **args)


def rust_dump(node, tmp_path, rank, world, epochs, batch_size=1000, seed=7, dataset="ads"):
    """What the Rust client (`granary trainer --dump`) delivers: every batch's tensor bytes, per epoch."""
    cmd = [node.bin, "trainer", "--socket", str(node.socket), "--dataset", dataset, "--rank", str(rank),
           "--world", str(world), "--batch-size", str(batch_size), "--seed", str(seed), "--dump", str(tmp_path)]
    feed = "".join(f"epoch {e}\n" for e in epochs)
    out = subprocess.run(cmd, input=feed, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, RUST_BACKTRACE="0"))
    assert out.returncode == 0, out.stderr
    return {e: (tmp_path / f"rank-{rank}-epoch-{e}.bin").read_bytes() for e in epochs}


def test_batches_equal_the_rust_clients_byte_for_byte(node, tmp_path):
    for rank in (0, 1):
        want = rust_dump(node, tmp_path, rank, 2, [0, 1])
        ld = granary.Loader(str(node.socket), "ads", 1000, seed=7, rank=rank, world_size=2)
        for e in (0, 1):
            got = bytearray()
            n = 0
            for batch in ld.epoch(e):
                for arr in batch.values():
                    got += arr.tobytes()
                n += 1
            assert n == len(ld)
            assert bytes(got) == want[e], f"rank {rank} epoch {e}: {len(got)} bytes vs {len(want[e])}"


def test_arrays_view_the_batch_buffer_and_describe_the_tensors(node):
    ld = loader(node)
    assert [t["name"] for t in ld.tensors] == ["dense", "emb", "ids", "label"]
    assert ld.total_rows == ROWS and len(ld.version) == 32
    batch = next(iter(ld.epoch(0)))
    assert list(batch) == ["dense", "emb", "ids", "label"] and len(batch) == 4 and "dense" in batch
    dense = batch["dense"]
    assert dense.dtype == np.float32 and dense.shape == (1000, 150)
    assert batch["ids"].dtype == np.int64 and batch["ids"].shape == (1000, 2)
    assert batch["label"].shape == (1000,)
    # No copy: the array points at the batch's buffer and keeps the batch as its base.
    assert dense.ctypes.data == batch.data_ptr("dense")
    assert dense.base is batch and not dense.flags.owndata
    assert dense.flags.c_contiguous and dense.flags.writeable and dense.ctypes.data % 64 == 0
    assert dense.nbytes == 1000 * 150 * 4
    assert batch.nbytes == sum(a.nbytes for a in batch.values())
    with pytest.raises(KeyError, match="tensors: dense, emb, ids, label"):
        batch["nope"]
    assert batch.get("nope") is None
    assert "epoch 0 batch 0" in repr(batch) and "dense f32[1000, 150]" in repr(batch)


def test_a_view_stays_valid_after_the_loader_moved_on_and_its_batch_is_freed_after(node):
    ld = loader(node, prefetch_batches=1, assembly_threads=1)
    it = iter(ld.epoch(1))
    first = next(it)
    kept = first["dense"]
    snapshot = kept.copy()
    ref = weakref.ref(first)
    del first
    gc.collect()
    assert ref() is not None, "the array must keep its batch alive"
    # The rest of the epoch reuses the pool's other buffers, never this one.
    rest = [b.checksum() for b in it]
    assert len(rest) == len(ld) - 1
    assert np.array_equal(kept, snapshot)
    del kept
    gc.collect()
    assert ref() is None, "the batch (and its buffer) must be freed once no array refers to it"


def test_a_block_shuffled_batch_views_the_nodes_chunk_memory_read_only(node):
    ld = loader(node, block_batches=2, batch_size=500)
    views = 0
    for batch in ld.epoch(0):
        arr = batch["dense"]
        if batch.is_view:
            views += 1
            assert not arr.flags.writeable
            with pytest.raises(ValueError):
                arr[0, 0] = 1.0
        else:
            assert arr.flags.writeable
    assert views > 0


def test_resume_from_a_state_dict_mid_epoch_gives_the_rest_of_the_epoch(node):
    full = [b.checksum() for b in loader(node).epoch(3)]
    ld = loader(node)
    it = ld.epoch(3)
    for _ in range(7):
        next(it)
    state = ld.state_dict()
    assert state == it.state_dict()
    assert (state["epoch"], state["batch"]) == (3, 7) and state["seed"] == 7 and state["version"] == ld.version
    state = json.loads(json.dumps(state))  # what a checkpoint holds
    # A new loader made from the state alone.
    again = granary.Loader.resuming(str(node.socket), state)
    assert [b.checksum() for b in again.epoch(3)] == full[7:]
    # Or load it into a loader with the same parameters.
    other = loader(node)
    other.load_state_dict(state)
    assert [b.checksum() for b in other.epoch(3)] == full[7:]
    assert [b.checksum() for b in other.epoch(3)] == full, "the loaded state applies once"
    # A state from other parameters is refused, naming the field.
    with pytest.raises(granary.ResumeMismatchError) as e:
        loader(node, seed=8).load_state_dict(state)
    assert e.value.field == "seed" and not e.value.retryable and isinstance(e.value, ValueError)
    with pytest.raises(granary.PositionPastEndError):
        loader(node).load_state_dict(dict(state, batch=len(ld) + 1))
    with pytest.raises(granary.ConfigError):
        loader(node).load_state_dict({"epoch": 1})


def test_four_ranks_as_four_processes_cover_every_row_exactly_once(node, tmp_path):
    helper = os.path.join(os.path.dirname(__file__), "rank_rows.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    outs = [tmp_path / f"rank-{r}.txt" for r in range(4)]
    procs = [subprocess.Popen([sys.executable, helper, str(node.socket), str(r), "4", str(outs[r])], env=env,
                              stderr=subprocess.PIPE) for r in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    got = sorted(line for o in outs for line in o.read_text().splitlines())
    # Every row once: the rows of one rank reading everything, unshuffled.
    ref = []
    for batch in granary.Loader(str(node.socket), "ads", 4096, shuffle=False).epoch(0):
        bits = batch["dense"][:, 0].view(np.uint32)
        ref += [f"{u} {i} {b}" for (u, i), b in zip(batch["ids"].tolist(), bits.tolist())]
    assert len(ref) == ROWS
    assert got == sorted(ref)


def test_errors_are_granary_exceptions_that_say_what_and_whether_to_retry(node, tmp_path):
    with pytest.raises(granary.UnknownDatasetError) as e:
        granary.Loader(str(node.socket), "nope", 100)
    assert e.value.served == ["ads", "hashed", "jagged", "typed", "weighted"] and e.value.dataset == "nope" and not e.value.retryable
    assert "nope" in str(e.value) and isinstance(e.value, LookupError)
    with pytest.raises(granary.PlanError) as e:
        loader(node, rank=4, world_size=4)
    assert isinstance(e.value, ValueError) and not e.value.retryable
    with pytest.raises(granary.VersionGoneError) as e:
        loader(node, version="00" * 16)
    assert e.value.version == "00" * 16 and len(e.value.current) == 32
    with pytest.raises(granary.ConfigError):
        loader(node, version="not hex")
    with pytest.raises(granary.ConfigError):
        loader(node, batch_size=0)
    gone = tmp_path / "gone.sock"
    with pytest.raises(granary.NodeUnavailableError) as e:
        granary.Loader(str(gone), "ads", 100)
    assert e.value.retryable and isinstance(e.value, ConnectionError) and str(gone) in str(e.value)
    assert issubclass(granary.NodeUnavailableError, granary.GranaryError)


def test_a_forked_child_is_refused_instead_of_hanging(node):
    ld = loader(node)
    it = ld.epoch(0)
    next(it)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: both the epoch and the loader refuse
        code = 1
        try:
            try:
                next(it)
            except granary.ForkedProcessError:
                try:
                    ld.epoch(1)
                except granary.ForkedProcessError as e:
                    os.write(w, str(e).encode())
                    code = 0
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    msg = os.read(r, 4096).decode()
    assert os.waitstatus_to_exitcode(status) == 0, msg
    assert "num_workers=0" in msg
    # The parent's loader goes on.
    assert sum(1 for _ in it) == len(ld) - 1


def test_other_threads_run_while_a_batch_is_awaited(node):
    """The GIL is released while next() waits: with the node stopped (SIGSTOP), a thread blocked in
    next() leaves the interpreter to the others, and gets its batch once the node continues."""
    import signal
    import threading
    import time

    ld = loader(node, mapping_cache_bytes=0, prefetch_batches=1, assembly_threads=1)
    got = []
    os.kill(node.proc.pid, signal.SIGSTOP)
    # Continues the node in 3 s whatever happens here: a held GIL would block this process.
    watchdog = subprocess.Popen(["sh", "-c", f"sleep 3; kill -CONT {node.proc.pid}"])
    try:
        t = threading.Thread(target=lambda: got.append(next(iter(ld.epoch(5))).rows))
        t.start()
        time.sleep(0.05)
        count, until = 0, time.monotonic() + 0.3
        while time.monotonic() < until:
            count += 1
        assert t.is_alive() and not got, "this thread ran only after next() returned: next() held the GIL"
    finally:
        os.kill(node.proc.pid, signal.SIGCONT)
        watchdog.kill()
    t.join(timeout=30)
    watchdog.wait()
    assert got == [1000]
    # Held, the GIL would have let this thread run only at the blocked thread's switch points: none.
    assert count > 10_000, count


def test_every_dtype_views_right_and_bf16_is_its_uint16_bits(node):
    typed = granary.Loader(str(node.socket), "typed", 1000, shuffle=False)
    ads = granary.Loader(str(node.socket), "ads", 1000, shuffle=False)
    assert {t["name"]: t["dtype"] for t in typed.tensors} == {
        "dense_bf16": "bf16", "dense_f16": "f16", "dense_f64": "f64", "ids32": "i32"}
    for t, a in zip(typed.epoch(0), ads.epoch(0)):
        dense = a["dense"][:, :8]
        assert t["dense_f64"].dtype == np.float64 and np.array_equal(t["dense_f64"], dense.astype(np.float64))
        assert t["dense_f16"].dtype == np.float16 and np.array_equal(t["dense_f16"], dense.astype(np.float16))
        assert t["ids32"].dtype == np.int32 and np.array_equal(t["ids32"], a["ids"].astype(np.int32))
        # bf16: the top 16 bits of the f32, rounded to nearest even.
        u = dense.view(np.uint32).astype(np.uint64)
        want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        assert t["dense_bf16"].dtype == np.uint16 and np.array_equal(t["dense_bf16"], want)
        assert t["dense_bf16"].ctypes.data == t.data_ptr("dense_bf16")


def test_settings_past_what_a_loader_can_hold_are_refused(node):
    for kw in (dict(prefetch_batches=0), dict(prefetch_batches=10**9), dict(assembly_threads=10**5)):
        with pytest.raises(granary.ConfigError):
            loader(node, **kw)
    with pytest.raises(OverflowError):
        loader(node, prefetch_batches=-1)
    with pytest.raises(granary.ConfigError, match="plain JSON"):
        loader(node).load_state_dict({"epoch": object()})


def test_the_state_moves_only_with_batches_handed_out(node):
    ld = loader(node)
    it = ld.epoch(6)
    next(it)
    next(it)
    at = ld.state_dict()
    assert (at["epoch"], at["batch"]) == (6, 2)
    ahead = ld.epoch(7)  # made early (as len() or a prefetching trainer may): the rank is still in epoch 6
    assert len(ahead) == len(ld) and ld.state_dict() == at
    assert it.position == (6, 2) and ahead.position == (7, 0)
    # A batch is a mapping: other keys are simply absent.
    b = next(it)
    assert 5 not in b and b.get(5, "none") == "none"
    assert b.dtypes == {"dense": "f32", "emb": "f32", "ids": "i64", "label": "f32"}


def test_a_node_too_new_for_this_client_is_a_protocol_error_naming_both_versions(tmp_path):
    """A node two local-protocol versions ahead refuses the hello (magic, then the versions it speaks);
    the trainer gets ProtocolError naming both ranges and what to upgrade, never "malformed frame"."""
    import socket
    import struct
    import threading

    path = tmp_path / "future.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def refuse():
        conn, _ = server.accept()
        with conn:
            hello = conn.recv(8)
            assert hello[:4] == b"GRNY"
            conn.sendall(b"GRNY" + struct.pack("<HHH", 0, 90, 91))

    t = threading.Thread(target=refuse, daemon=True)
    t.start()
    with pytest.raises(granary.ProtocolError) as e:
        granary.Loader(str(path), "ads", 100)
    msg = str(e.value)
    assert "local protocol 90 to 91" in msg and "upgrade granary in the trainer" in msg, msg
    assert "malformed" not in msg and not e.value.retryable
    t.join(timeout=10)
    server.close()


def test_a_loader_reports_its_stalls(node):
    """Issue 48: how often and how long a loader waited for its node to
    come back; none while the node stays up (tests/rough_edges.rs counts a
    restart's)."""
    ld = granary.Loader(str(node.socket), "ads", 1000)
    for _ in ld.epoch(0):
        pass
    assert ld.stalls() == {"reconnects": 0, "waited_s": 0.0}

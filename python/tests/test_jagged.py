"""Jagged tensors (list and byte columns) in Python: granary.Jagged views, the Rust client's bytes,
padding, and the pieces of TorchRec's KeyedJaggedTensor."""

import numpy as np
import pytest

import granary

from conftest import JAGGED_ROWS
from test_loader import rust_dump


def loader(node, batch_size=256, **kw):
    args = dict(seed=7, rank=0, world_size=1)
    args.update(kw)
    return granary.Loader(str(node.socket), "jagged", batch_size, **args)


def test_a_jagged_tensor_is_values_and_offsets_that_view_the_batch(node):
    ld = loader(node)
    assert [(t["name"], t["jagged"]) for t in ld.tensors][-3:] == [("hist", True), ("cats", True), ("blob", True)]
    batch = next(iter(ld.epoch(0)))
    assert batch.jagged == ["hist", "cats", "blob"]
    hist = batch["hist"]
    assert isinstance(hist, granary.Jagged) and len(hist) == batch.rows == 256
    assert hist.values.dtype == np.int64 and hist.offsets.dtype == np.int64
    assert hist.offsets.shape == (257,) and hist.offsets[0] == 0 and hist.offsets[-1] == len(hist.values)
    assert (hist.lengths == np.diff(hist.offsets)).all() and (hist.lengths >= 0).all()
    # No copy: the values are the batch's bytes, and keep the batch alive.
    assert hist.values.ctypes.data == batch.data_ptr("hist") and hist.values.base is batch
    assert hist.offsets.base is batch and hist.offsets.ctypes.data % 8 == 0
    assert batch["cats"].values.dtype == np.int32
    blob = batch["blob"]
    assert blob.values.dtype == np.uint8 and all(1024 <= len(bytes(r)) <= 4096 for r in blob)
    assert batch.nbytes == sum(a.nbytes for a in batch.values())
    assert "hist i64[256, *]" in repr(batch)
    assert "256 rows of int64" in repr(hist)
    for i in (0, 17, -1):
        r = i % 256
        assert hist[i].tolist() == hist.values[hist.offsets[r] : hist.offsets[r + 1]].tolist()
    with pytest.raises(IndexError):
        hist[256]


def test_batches_equal_the_rust_clients_byte_for_byte(node, tmp_path):
    """The Rust client's dump holds, per batch, each dense tensor's bytes and each jagged tensor's
    offsets then values; a Python batch gives the same, and the same checksum."""
    want = rust_dump(node, tmp_path, 1, 2, [3], batch_size=100, dataset="jagged")[3]
    ld = loader(node, 100, rank=1, world_size=2)
    got = bytearray()
    for batch in ld.epoch(3):
        for arr in batch.values():
            if isinstance(arr, granary.Jagged):
                got += arr.offsets.tobytes() + arr.values.tobytes()
            else:
                got += arr.tobytes()
    assert bytes(got) == want
    # Every row of the epoch, across both ranks, once.
    rows = sum(b.rows for r in (0, 1) for b in loader(node, 100, rank=r, world_size=2).epoch(3))
    assert rows == JAGGED_ROWS


def test_to_padded_and_tolist(node):
    j = granary.Jagged(np.arange(6, dtype=np.int64), np.array([0, 2, 2, 6], dtype=np.int64))
    assert j.tolist() == [[0, 1], [], [2, 3, 4, 5]]
    assert j.lengths.tolist() == [2, 0, 4]
    assert j.to_padded().tolist() == [[0, 1, 0, 0], [0, 0, 0, 0], [2, 3, 4, 5]]
    assert j.to_padded(3, fill=-1).tolist() == [[0, 1, -1], [-1, -1, -1], [2, 3, 4]]
    assert j.to_padded(0).shape == (3, 0)
    with pytest.raises(ValueError, match="last offset"):
        granary.Jagged(np.arange(5), np.array([0, 6]))
    # On a real batch: padding keeps every row's first values.
    batch = next(iter(loader(node).epoch(1)))
    hist = batch["hist"]
    dense = hist.to_padded(8, fill=-1)
    assert dense.shape == (256, 8)
    for i in range(256):
        n = min(8, int(hist.lengths[i]))
        assert dense[i, :n].tolist() == hist[i][:n].tolist() and (dense[i, n:] == -1).all()


def test_block_batches_inside_one_chunk_view_its_values_read_only(node):
    ld = loader(node, block_batches=2)
    views = 0
    for batch in ld.epoch(0):
        if batch.is_view:
            views += 1
            hist = batch["hist"]
            assert not hist.values.flags.writeable and hist.offsets[0] == 0
    assert views > 0


def test_hashed_ids_are_xxh3_of_the_bytes_modulo_the_buckets(node):
    """`hash = { buckets = N }` gives each row's bytes the id XXH3-64 (seed 0) % N: the `xxhash` package
    recomputes every id of an epoch from the same rows' bytes."""
    xxhash = pytest.importorskip("xxhash", reason="the xxhash package recomputes the ids (pip install xxhash)")
    from conftest import HASH_BUCKETS

    ld = granary.Loader(str(node.socket), "hashed", 500, seed=7, rank=0, world_size=1)
    seen = 0
    for batch in ld.epoch(0):
        ids = batch["blob_id"]
        assert ids.dtype == np.int64 and ids.shape == (batch.rows,)
        want = [xxhash.xxh3_64_intdigest(bytes(r), seed=0) % HASH_BUCKETS for r in batch["blob"]]
        assert ids.tolist() == want
        seen += batch.rows
    assert seen == JAGGED_ROWS

"""granary.torch against a real node: tensors without a copy, DataLoader, epochs, resume."""

import json

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (Debian: apt-get install python3-torch)")

import granary  # noqa: E402
import granary.torch as gt  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402


def test_from_dlpack_of_a_batch_array_shares_its_memory(node):
    batch = next(iter(granary.Loader(str(node.socket), "ads", 1000).epoch(0)))
    dense = batch["dense"]
    t = torch.from_dlpack(dense)
    assert t.data_ptr() == batch.data_ptr("dense") and t.shape == (1000, 150) and t.dtype == torch.float32
    t2 = torch.from_numpy(batch["ids"])
    assert t2.data_ptr() == batch.data_ptr("ids") and t2.dtype == torch.int64
    # The tensor alone keeps the batch's buffer alive.
    del batch, dense
    assert float(t.sum()) == float(t.clone().sum())


def test_the_iterable_dataset_yields_the_loaders_batches_as_tensors_and_resumes(node):
    ds = gt.IterableDataset(str(node.socket), "ads", 1000, rank=1, world_size=2, seed=5)
    ref = granary.Loader(str(node.socket), "ads", 1000, rank=1, world_size=2, seed=5)
    dl = DataLoader(ds, batch_size=None, num_workers=0)
    assert len(dl) == len(ref)
    ds.set_epoch(2)
    want = [b.checksum() for b in ref.epoch(2)]
    got = []
    for batch in dl:
        assert set(batch) == {"dense", "emb", "ids", "label"} and batch["dense"].dtype == torch.float32
        got.append(batch)
    assert len(got) == len(want)
    # The same bytes as the loader's own batches.
    again = list(ref.epoch(2))
    for t, b in zip(got, again):
        for name in b:
            assert t[name].numpy().tobytes() == b[name].tobytes()
    # Resume mid-epoch from the dataset's state dict.
    ds.set_epoch(4)
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = ds.state_dict()
    ds2 = gt.IterableDataset(str(node.socket), "ads", 1000, rank=1, world_size=2, seed=5)
    ds2.load_state_dict(state)
    assert ds2.epoch == 4
    rest = [torch.cat([v.flatten().view(torch.uint8) for v in b.values()]) for b in DataLoader(ds2, batch_size=None)]
    full = [b for b in ref.epoch(4)]
    assert len(rest) == len(full) - 3
    for t, b in zip(rest, full[3:]):
        assert t.numpy().tobytes() == b"".join(a.tobytes() for a in b.values())


def test_rank_and_world_come_from_the_environment_without_torch_distributed(node, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ds = gt.IterableDataset(str(node.socket), "ads", 500)
    assert (ds.loader.rank, ds.loader.world_size) == (2, 3)


def test_dataloader_workers_are_refused_with_the_reason(node):
    ds = gt.IterableDataset(str(node.socket), "ads", 1000)
    with pytest.raises(Exception, match="num_workers=0"):
        next(iter(DataLoader(ds, batch_size=None, num_workers=1)))


def test_block_shuffled_batches_are_copied_once_unless_asked_to_share(node):
    ds = gt.IterableDataset(str(node.socket), "ads", 500, block_batches=2, copy_read_only=False)
    ptrs = []
    for batch in ds.loader.epoch(0):
        t = gt.to_torch(batch, copy_read_only=False)
        ptrs.append(t["dense"].data_ptr() == batch.data_ptr("dense"))
    assert all(ptrs)
    batch = next(b for b in ds.loader.epoch(0) if b.is_view)
    assert gt.to_torch(batch)["dense"].data_ptr() != batch.data_ptr("dense")


def test_bf16_comes_as_torch_bfloat16_without_a_copy(node):
    ds = gt.IterableDataset(str(node.socket), "typed", 1000, shuffle=False)
    batch = next(iter(ds.loader.epoch(0)))
    t = gt.to_torch(batch, bf16={"dense_bf16"}, copy_read_only=False)  # unshuffled: a view of the chunk
    assert t["dense_bf16"].dtype == torch.bfloat16 and t["dense_bf16"].shape == (1000, 8)
    assert t["dense_bf16"].data_ptr() == batch.data_ptr("dense_bf16")
    f32 = t["dense_bf16"].float()
    assert torch.allclose(f32, t["dense_f64"].float(), rtol=1e-2, atol=0)
    # The dataset finds the bf16 tensors itself.
    first = next(iter(DataLoader(ds, batch_size=None)))
    assert first["dense_bf16"].dtype == torch.bfloat16 and first["ids32"].dtype == torch.int32


def test_the_dataset_cannot_be_sent_to_a_spawned_worker_and_a_state_at_an_epochs_end_moves_on(node):
    import pickle

    ds = gt.IterableDataset(str(node.socket), "ads", 1000)
    with pytest.raises(granary.ForkedProcessError, match="num_workers=0"):
        pickle.dumps(ds)
    for _ in ds:
        pass
    state = ds.state_dict()
    assert (state["epoch"], state["batch"]) == (0, len(ds))
    again = gt.IterableDataset(str(node.socket), "ads", 1000)
    again.load_state_dict(state)
    assert again.epoch == 1


def test_jagged_tensors_come_as_values_offsets_and_lengths_and_make_kjt_parts(node):
    ref = granary.Loader(str(node.socket), "jagged", 128, seed=3)
    batch = next(iter(ref.epoch(0)))
    t = gt.to_torch(batch)
    hist = t["hist"]
    assert isinstance(hist, gt.JaggedTensor) and hist.values.dtype == torch.int64
    assert hist.values.data_ptr() == batch.data_ptr("hist"), "the values are the batch's own"
    assert hist.offsets.dtype == torch.int64 and hist.offsets.shape == (129,)
    assert hist.lengths.tolist() == batch["hist"].lengths.tolist()
    assert t["label"].shape == (128,)
    # One key: the batch's values and offsets, no copy.
    one = gt.kjt_parts(t, ["hist"])
    assert one["keys"] == ["hist"] and one["values"].data_ptr() == hist.values.data_ptr()
    assert one["offsets"].data_ptr() == hist.offsets.data_ptr()
    # Several keys share a dtype (cats is i32, hist i64: refused by name).
    with pytest.raises(TypeError, match="cats: torch.int32"):
        gt.kjt_parts(t, ["hist", "cats"])
    with pytest.raises(TypeError, match="'label' is dense"):
        gt.kjt_parts(t, ["label"])
    two = gt.kjt_parts({"a": t["hist"], "b": t["hist"]})
    assert two["keys"] == ["a", "b"] and two["lengths"].shape == (256,)
    assert two["offsets"][0] == 0 and int(two["offsets"][-1]) == len(two["values"]) == 2 * len(hist.values)
    # Key-major: key b's rows follow key a's.
    for k, key in enumerate(two["keys"]):
        for r in (0, 5, 127):
            i = k * 128 + r
            got = two["values"][two["offsets"][i] : two["offsets"][i + 1]]
            assert got.tolist() == batch[["hist", "hist"][k]][r].tolist()
    padded = gt.to_padded(hist, 16, fill=-1)
    assert padded.shape == (128, 16)
    assert padded.numpy().tolist() == batch["hist"].to_padded(16, fill=-1).tolist()
    # Byte columns come as u8 values.
    assert t["blob"].values.dtype == torch.uint8


def test_the_iterable_dataset_yields_jagged_tensors(node):
    ds = gt.IterableDataset(str(node.socket), "jagged", 500, rank=0, world_size=1, seed=1)
    rows = 0
    for b in DataLoader(ds, batch_size=None, num_workers=0):
        assert isinstance(b["cats"], gt.JaggedTensor) and b["cats"].values.dtype == torch.int32
        assert int(b["cats"].offsets[-1]) == len(b["cats"].values)
        rows += len(b["label"])
    assert rows == 4_000


def test_a_global_plan_job_resumes_on_another_world_size_with_the_same_steps(node):
    """Issue 32: 4 ranks of the global plan read half an epoch; rank 2's state_dict resumes the job on
    2 ranks (as torchrun's elastic agent restarts it with fewer processes), and every global step holds
    the rows one rank reading the whole epoch gets, in its order; every row comes exactly once."""
    sock, g = str(node.socket), 1200
    kw = dict(global_batch=g, partitions=4, seed=9)
    ref = granary.Loader(sock, "ads", g, **kw)
    assert ref.global_batch == g
    reference = [b.row_digests() for b in ref.epoch(0)]
    total = len(reference)
    assert sum(len(r) for r in reference) == 20_000

    four = [granary.Loader(sock, "ads", g // 4, rank=r, world_size=4, **kw) for r in range(4)]
    its = [ld.epoch(0) for ld in four]
    k = total // 2
    got = [[d for it in its for d in next(it).row_digests()] for _ in range(k)]
    state = json.loads(json.dumps(four[2].state_dict()))
    assert state["plan"] == {"kind": "global", "global_batch": g, "partitions": 4} and state["batch"] == k

    # torchrun restarts the job on 2 processes: each makes its dataset and loads the saved state.
    two = []
    for r in range(2):
        ds = gt.IterableDataset(sock, "ads", rank=r, world_size=2, **kw)
        ds.load_state_dict(state)
        assert ds.epoch == 0 and ds.loader.batch_size == g // 2
        two.append(iter(DataLoader(ds, batch_size=None, num_workers=0)))
    # The same ranks as plain loaders made from the state, for their rows.
    native = [granary.Loader.resuming(sock, state, rank=r, world_size=2).epoch(0) for r in range(2)]
    for _ in range(total - k):
        step = []
        for t_it, n_it in zip(two, native):
            t, b = next(t_it), next(n_it)
            for name in b:
                assert t[name].numpy().tobytes() == b[name].tobytes()
            step += b.row_digests()
        got.append(step)
    assert got == reference
    flat = [d for step in got for d in step]
    assert len(flat) == len(set(flat)) == 20_000
    # A world size that does not divide the global batch is refused by name.
    with pytest.raises(ValueError, match="must divide the global batch"):
        gt.IterableDataset(sock, "ads", rank=0, world_size=7, global_batch=g)
    with pytest.raises(ValueError, match="global_batch / world_size"):
        granary.Loader(sock, "ads", 100, world_size=4, global_batch=g)

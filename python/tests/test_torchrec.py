"""Real TorchRec (issue 44): an EmbeddingBagCollection gives the same pooled embeddings on Granary's
KeyedJaggedTensor as on one built from pyarrow for the same rows, and a small DLRM-style model trained
100 steps on each gives the same losses. `.ci/run` runs this file in its own venv (torch 2.14.1,
torchrec 1.9.2, fbgemm-gpu-cpu 1.9.0 and pyarrow from PyPI; ../shared/research/torchrec-cpu.md);
beside Debian's torch, which has no torchrec, it says skipped."""

import pathlib

import numpy as np
import pytest

torchrec = pytest.importorskip("torchrec", reason="torchrec is not importable: .ci/run installs it in its own venv")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not importable: .ci/run installs it with torchrec")

import torch  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

import granary  # noqa: E402
import granary.torch as gt  # noqa: E402

from conftest import JAGGED_ROWS  # noqa: E402

BATCH = 40


def granary_batches(node, dataset="jagged"):
    """A dataset in manifest order (shuffle off), as torch tensors."""
    ld = granary.Loader(str(node.socket), dataset, BATCH, seed=1, rank=0, world_size=1, shuffle=False)
    return [gt.to_torch(b) for b in ld.epoch(0)]


def pyarrow_batches(node):
    """The same rows read by pyarrow from the files, in path order."""
    files = sorted(pathlib.Path(node.jagged_data).glob("*.parquet"))
    table = __import__("pyarrow").concat_tables([pq.read_table(f, columns=["cats", "label"]) for f in files])
    cats = table.column("cats").to_pylist()
    label = np.asarray(table.column("label").to_numpy(), dtype=np.float32)
    out = []
    for s in range(0, len(cats), BATCH):
        rows = cats[s : s + BATCH]
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
        values = torch.tensor([v for r in rows for v in r], dtype=torch.int32)
        out.append((values, lengths, torch.from_numpy(label[s : s + BATCH].copy())))
    return out


def ebc(weighted=False):
    torch.manual_seed(0)
    table = EmbeddingBagConfig(name="t_cats", embedding_dim=8, num_embeddings=1000, feature_names=["cats"],
                               pooling=PoolingType.SUM)
    return EmbeddingBagCollection(tables=[table], is_weighted=weighted, device=torch.device("cpu"))


def test_pooled_embeddings_equal_those_of_pyarrow_rows(node):
    mine, ref = granary_batches(node), pyarrow_batches(node)
    assert len(mine) == len(ref) == JAGGED_ROWS // BATCH
    bags = ebc()
    for b, (values, lengths, _) in zip(mine, ref):
        kjt = KeyedJaggedTensor(**gt.kjt_parts(b, ["cats"]))
        # One key: the batch's own values, not a copy.
        assert kjt.values().data_ptr() == b["cats"].values.data_ptr()
        theirs = KeyedJaggedTensor(keys=["cats"], values=values, lengths=lengths)
        assert torch.equal(kjt.lengths(), theirs.lengths())
        assert torch.equal(bags(kjt)["cats"], bags(theirs)["cats"])


def test_int32_lengths_and_weights_pool_as_pyarrow_rows_do(node):
    """Lengths and offsets as int32 (TorchRec's kernels take them), and an id-score list: the `weighted`
    dataset's `cats_w` are the same rows' weights, (cats - 500) / 1000, with the same offsets."""
    ref = pyarrow_batches(node)
    plain, weighted = ebc(), ebc(weighted=True)
    for b, (values, lengths, _) in zip(granary_batches(node, "weighted"), ref):
        parts = gt.kjt_parts(b, ["cats"], lengths_dtype=torch.int32)
        assert parts["lengths"].dtype == torch.int32 and parts["offsets"].dtype == torch.int32
        theirs = KeyedJaggedTensor(keys=["cats"], values=values, lengths=lengths.to(torch.int32))
        assert torch.equal(plain(KeyedJaggedTensor(**parts))["cats"], plain(theirs)["cats"])
        w = gt.kjt_parts(b, ["cats"], weights={"cats": "cats_w"})
        assert w["weights"].data_ptr() == b["cats_w"].values.data_ptr(), "the batch's own weights"
        want = ((values.to(torch.float64) - 500) / 1000).to(torch.float32)
        theirs_w = KeyedJaggedTensor(keys=["cats"], values=values, lengths=lengths, weights=want)
        assert torch.equal(weighted(KeyedJaggedTensor(**w))["cats"], weighted(theirs_w)["cats"])


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bags = ebc()
        self.top = torch.nn.Linear(8, 1)

    def forward(self, kjt):
        return self.top(self.bags(kjt)["cats"]).squeeze(1)


def test_a_hundred_steps_give_the_same_losses(node):
    def train(batches):
        torch.manual_seed(1)
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for kjt, label in batches[:100]:
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(kjt), label)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    mine = [(KeyedJaggedTensor(**gt.kjt_parts(b, ["cats"])), b["label"].reshape(-1)) for b in granary_batches(node)]
    ref = [(KeyedJaggedTensor(keys=["cats"], values=v, lengths=n), y) for v, n, y in pyarrow_batches(node)]
    a, b = train(mine), train(ref)
    assert len(a) == 100 and a == b

"""Granary for PyTorch: an ``IterableDataset`` whose batches are torch tensors that view Granary's buffers.

    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from granary.torch import IterableDataset

    ds = IterableDataset("/run/granary/node.sock", "ads", 4096, seed=2026)   # rank, world from torch.distributed
    loader = DataLoader(ds, batch_size=None, num_workers=0)
    for epoch in range(start_epoch, epochs):
        ds.set_epoch(epoch)
        for batch in loader:                   # {"dense": tensor(4096, 150), ...}, no copy
            ...
        checkpoint["data"] = ds.state_dict()   # resume: ds.load_state_dict(checkpoint["data"])

One Granary rank per training process. Use ``DataLoader(batch_size=None, num_workers=0)``: Granary's
own threads already assemble batches ahead of the trainer (``prefetch_batches``, ``assembly_threads``),
outside the GIL, so worker processes add nothing but a copy. With ``num_workers`` > 0 each worker would
be a fork of this process, where the loader's node connection and threads do not exist, and every batch
would be copied through shared memory on its way back; iterating refuses with
:class:`granary.ForkedProcessError` instead.

Tensors view Granary's memory: ``torch.from_numpy`` on the batch's arrays, so ``t.data_ptr()`` is the
address of Granary's buffer and the buffer stays alive while any tensor uses it. bf16 tensors come as
``torch.bfloat16`` (reinterpreted from their uint16 bits, no copy). A batch that is one run of one chunk
(the block shuffle, ``block_batches`` > 0, or an unshuffled plan) views the node's chunk memory, which
is mapped read-only and shared with every rank on the host. torch has no read-only tensors, and an
in-place op on such memory kills the process (SIGSEGV), so by default those batches are copied once
(``copy_read_only=True``). ``copy_read_only=False`` hands out the chunk memory itself: only for code
that never writes into a batch.

A jagged tensor (a list or byte column, :class:`granary.Jagged` in numpy) comes as a
:class:`JaggedTensor` of torch tensors (``values``, ``offsets``, ``lengths``), the values and offsets
without a copy. :func:`kjt_parts` gathers a batch's jagged tensors into the arguments of TorchRec's
``KeyedJaggedTensor`` (``torchrec.KeyedJaggedTensor(**gt.kjt_parts(batch))``); :func:`to_padded` makes
one dense for models that want ``(rows, max_len)`` tensors.
"""

import os
from typing import NamedTuple

import numpy as np
import torch
import torch.utils.data

from . import Loader
from .errors import ForkedProcessError
from .jagged import Jagged

__all__ = ["IterableDataset", "JaggedTensor", "kjt_parts", "to_padded", "to_torch"]


class JaggedTensor(NamedTuple):
    """A jagged tensor as torch tensors: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    ``values`` and ``offsets`` (int64, rows + 1, the first 0) view the batch's memory; ``lengths`` (int64,
    one per row) is computed from the offsets.
    """

    values: torch.Tensor
    offsets: torch.Tensor
    lengths: torch.Tensor


def _tensor(arr, bf16, copy_read_only):
    if not arr.flags.writeable and copy_read_only:
        arr = arr.copy()
    if bf16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def kjt_parts(batch, keys=None, weights=None, lengths_dtype=None):
    """The jagged tensors ``keys`` of ``batch`` (a dict from :func:`to_torch`; default: all its jagged
    tensors, in order) as the keyword arguments of TorchRec's ``KeyedJaggedTensor``: ``keys``,
    ``values`` key-major, ``lengths`` and ``offsets`` (key-major, ``len(keys) * rows`` and one more).
    With one key the values and offsets are the batch's own (no copy); with more, the values are
    concatenated, so they must share a dtype.

    ``weights``: for each key, the name of a jagged tensor of the same rows' weights (an id-score list's
    ``tags.weight`` beside its ``tags.id``: the same offsets, checked), given as ``weights``. Float32, as
    TorchRec's weighted kernels take them (cast in the view otherwise). ``lengths_dtype``: ``torch.int32``
    gives int32 lengths and offsets (a copy of them, ``rows + 1`` values a key), which TorchRec's kernels
    also take; default int64, the batch's own."""
    if keys is None:
        keys = [name for name, t in batch.items() if isinstance(t, JaggedTensor)]
    keys = list(keys)
    if not keys:
        raise ValueError("the batch has no jagged tensors (list or byte columns) to make a KeyedJaggedTensor of")
    parts = []
    for k in keys:
        t = batch[k]
        if not isinstance(t, JaggedTensor):
            raise TypeError(f"tensor {k!r} is dense, not jagged: a KeyedJaggedTensor holds list columns")
        parts.append(t)
    dtypes = {t.values.dtype for t in parts}
    if len(dtypes) > 1:
        have = ", ".join(f"{k}: {t.values.dtype}" for k, t in zip(keys, parts))
        raise TypeError(f"a KeyedJaggedTensor's values share one dtype; these differ ({have}): cast in the view")
    if len(parts) == 1:
        t = parts[0]
        out = {"keys": keys, "values": t.values, "lengths": t.lengths, "offsets": t.offsets}
    else:
        lengths = torch.cat([t.lengths for t in parts])
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        out = {"keys": keys, "values": torch.cat([t.values for t in parts]), "lengths": lengths, "offsets": offsets}
    if weights is not None:
        names = [weights[k] for k in keys] if isinstance(weights, dict) else list(weights)
        if len(names) != len(keys):
            raise ValueError(f"one weights tensor a key: {len(keys)} keys, {len(names)} weights")
        ws = []
        for k, t, w in zip(keys, parts, names):
            wt = batch[w]
            if not isinstance(wt, JaggedTensor) or not torch.equal(wt.offsets, t.offsets):
                raise ValueError(f"weights {w!r} must be a jagged tensor with the same rows' lengths as {k!r}")
            if wt.values.dtype != torch.float32:
                raise TypeError(f"weights {w!r} are {wt.values.dtype}; TorchRec takes float32 (dtype = \"f32\" in the view)")
            ws.append(wt.values)
        out["weights"] = ws[0] if len(ws) == 1 else torch.cat(ws)
    if lengths_dtype is not None and lengths_dtype != torch.int64:
        out["lengths"] = out["lengths"].to(lengths_dtype)
        out["offsets"] = out["offsets"].to(lengths_dtype)
    return out


def to_padded(jagged, max_len=None, fill=0):
    """A dense tensor of shape ``(rows, max_len, *value_shape)`` from a :class:`JaggedTensor`: each row's
    first ``max_len`` values (default: the longest row's length), then ``fill``. A copy."""
    values, offsets, lengths = jagged
    rows = len(lengths)
    if max_len is None:
        max_len = int(lengths.max()) if rows else 0
    if max_len < 0:
        raise ValueError(f"max_len must be >= 0, not {max_len}")
    out = torch.full((rows, max_len) + tuple(values.shape[1:]), fill, dtype=values.dtype)
    keep = torch.clamp(lengths, max=max_len)
    total = int(keep.sum())
    if total:
        row = torch.repeat_interleave(torch.arange(rows), keep)
        starts = torch.cumsum(keep, 0) - keep
        col = torch.arange(total) - torch.repeat_interleave(starts, keep)
        out[row, col] = values[offsets[:-1][row] + col]
    return out


def to_torch(batch, bf16=None, copy_read_only=True):
    """The batch's arrays as a dict of torch tensors that share their memory; a jagged tensor as a
    :class:`JaggedTensor`.

    ``bf16`` names the tensors whose uint16 bits are bf16 (default: the batch's own ``dtypes``). A
    read-only array (a view of the node's chunk memory) is copied unless ``copy_read_only`` is false,
    in which case writing into its tensor kills the process.
    """
    if bf16 is None:
        bf16 = {name for name, dtype in batch.dtypes.items() if dtype == "bf16"}
    out = {}
    for name, arr in batch.items():
        if isinstance(arr, Jagged):
            lengths = torch.from_numpy(arr.lengths)
            values = _tensor(arr.values, name in bf16, copy_read_only)
            out[name] = JaggedTensor(values, _tensor(arr.offsets, False, copy_read_only), lengths)
        else:
            out[name] = _tensor(arr, name in bf16, copy_read_only)
    return out


def _rank_and_world(rank, world_size):
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
    else:
        r, w = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return (r if rank is None else int(rank)), (w if world_size is None else int(world_size))


class IterableDataset(torch.utils.data.IterableDataset):
    """One rank's Granary batches as a PyTorch ``IterableDataset``.

    ``rank`` and ``world_size`` default to ``torch.distributed``'s when it is initialised, else to the
    ``RANK`` and ``WORLD_SIZE`` environment variables (as torchrun sets them), else to 0 and 1. Every
    other keyword is :class:`granary.Loader`'s (``seed``, ``shuffle``, ``window_shards``,
    ``block_batches``, ``drop_last``, ``version``, ``prefetch_batches``, ...).

    Iterating yields the batches of the epoch last given to :meth:`set_epoch` (0 at first), each a dict
    of tensor name to ``torch.Tensor``; ``len()`` is batches per epoch. :meth:`state_dict` and
    :meth:`load_state_dict` carry the whole resume state (a plain dict): after a load, iterating the
    saved epoch continues at exactly its next batch.

    With ``global_batch=G`` (and ``batch_size`` left out: it is then ``G // world_size``) the ranks walk
    the global plan: every world size that divides ``G`` sees the same global steps, so a job restarted
    by torchrun's elastic agent on fewer or more processes loads any rank's :meth:`state_dict` and
    continues the epoch at the same step, with no row lost or repeated. ``partitions`` (default 1) is the
    number of canonical partitions, fixed for the job: a rank reads about ``1/world_size`` of the
    shards in each window when it is a multiple of the world sizes the job runs on.
    """

    def __init__(
        self, socket, dataset, batch_size=None, *, rank=None, world_size=None, copy_read_only=True, **loader_kwargs
    ):
        super().__init__()
        rank, world_size = _rank_and_world(rank, world_size)
        global_batch = loader_kwargs.get("global_batch")
        if batch_size is None:
            if global_batch is None:
                raise TypeError("IterableDataset needs batch_size (rows per rank) or global_batch (rows per step)")
            if global_batch % world_size:
                raise ValueError(
                    f"global_batch={global_batch} cannot be split over world_size={world_size}: the world size "
                    "must divide the global batch"
                )
            batch_size = global_batch // world_size
        self.loader = Loader(socket, dataset, batch_size, rank=rank, world_size=world_size, **loader_kwargs)
        self._bf16 = frozenset(t["name"] for t in self.loader.tensors if t["dtype"] == "bf16")
        self._copy_read_only = copy_read_only
        self._epoch = 0

    def set_epoch(self, epoch):
        """Iterate epoch ``epoch`` next (call it before each epoch, as with ``DistributedSampler``)."""
        self._epoch = int(epoch)

    @property
    def epoch(self):
        """The epoch the next iteration yields."""
        return self._epoch

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None:
            raise ForkedProcessError(
                f"granary.torch.IterableDataset runs in DataLoader worker {info.id} of {info.num_workers}: "
                "Granary assembles batches on its own threads in the training process; use "
                "DataLoader(dataset, batch_size=None, num_workers=0)"
            )
        for batch in self.loader.epoch(self._epoch):
            yield to_torch(batch, self._bf16, self._copy_read_only)

    def state_dict(self):
        """The resume state at the next batch (a plain dict for the checkpoint)."""
        return self.loader.state_dict()

    def load_state_dict(self, state):
        """Continue from ``state``: the next iteration is its epoch, from its next batch (or the epoch
        after, when the state was saved at an epoch's end)."""
        self.loader.load_state_dict(state)
        epoch = int(state["epoch"])
        self._epoch = epoch + 1 if int(state["batch"]) >= self.loader.num_batches(epoch) else epoch

    def __reduce__(self):
        # Spawned DataLoader workers (spawn or forkserver) get the dataset pickled.
        raise ForkedProcessError(
            "granary.torch.IterableDataset cannot be sent to another process (a DataLoader worker): "
            "Granary assembles batches on its own threads in the training process; use "
            "DataLoader(dataset, batch_size=None, num_workers=0)"
        )

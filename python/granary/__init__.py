"""Granary's trainer client for Python.

``granary.Loader`` reads one dataset version from the Granary node on this
host, in an order that is a pure function of the job (seed, rank, world
size, batch size, shuffle): the same batches, byte for byte, as the Rust
client ``granary-client`` gives the same rank. Each batch is a mapping from
tensor name to a numpy array that views Granary's batch buffer: no copy is
made, and the buffer is reused only once no array refers to it.

    import granary

    loader = granary.Loader("/run/granary/node.sock", "ads", 4096,
                            seed=2026, rank=rank, world_size=world_size)
    for epoch in range(3):
        for batch in loader.epoch(epoch):
            dense = batch["dense"]          # numpy float32, shape (4096, 150), a view
            hist = batch["hist"]            # a list column: granary.Jagged (.values, .offsets, .lengths)
            ...
        state = loader.state_dict()         # a plain dict for the checkpoint

With ``global_batch=G`` (and ``batch_size=G // world_size``) the ranks walk the global plan: its
steps are the same on every world size dividing ``G``, so a job restarted on another number of ranks
loads any rank's ``state_dict()`` and continues the epoch at the same step.

For PyTorch, see :mod:`granary.torch`.
"""

from collections.abc import Mapping as _Mapping

from . import errors
from ._granary import Batch, Epoch, Loader, __version__
from .errors import *  # noqa: F403 (the exception classes; errors.__all__ names them)
from .jagged import Jagged

# A batch is a read-only mapping of name to array.
_Mapping.register(Batch)

__all__ = ["Loader", "Epoch", "Batch", "Jagged", "errors", "__version__", *errors.__all__]

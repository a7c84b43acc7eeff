"""Type stubs of the native module (see ``granary/__init__.py`` for the documentation)."""

from os import PathLike
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

__version__: str

_Path = Union[str, "PathLike[str]"]
ResumeState = Dict[str, Any]
"""The Rust client's ``ResumeState`` in its JSON form: ``dataset``, ``version`` (32 hex digits),
``seed``, ``rank``, ``world_size``, ``batch_size``, ``shuffle``, ``drop_last``, ``plan`` (``{"kind": "rank"}`` or
``{"kind": "global", "global_batch": G, "partitions": P}``), ``epoch``, ``batch``."""

class Batch:
    """A read-only mapping from tensor name to a numpy array that views the batch's buffer (no copy).

    The arrays keep the batch alive; its buffer goes back to the loader only once no array (or
    tensor made from one without a copy) refers to it. bf16 tensors are uint16 arrays of the same
    bits. A batch that is one run of one chunk (the block shuffle, or an unshuffled plan) views the
    node's memory: its arrays are read-only (``is_view``).
    """

    def __getitem__(self, name: str) -> np.ndarray: ...
    def get(self, name: object, default: Any = None) -> Any: ...
    def __contains__(self, name: object) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[str]: ...
    def keys(self) -> List[str]: ...
    def values(self) -> List[np.ndarray]: ...
    def items(self) -> List[Tuple[str, np.ndarray]]: ...
    def numpy(self) -> Dict[str, np.ndarray]:
        """A plain dict of name to array (the arrays still view the batch)."""
    @property
    def rows(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def index_in_epoch(self) -> int: ...
    @property
    def is_view(self) -> bool:
        """True when the arrays view the node's chunk memory in place (read-only)."""
    @property
    def nbytes(self) -> int: ...
    @property
    def dtypes(self) -> Dict[str, str]:
        """Each tensor's Granary dtype name (``bf16`` arrays are uint16)."""
    def data_ptr(self, name: str) -> int:
        """The address of tensor ``name``'s first byte (what its arrays point at)."""
    def checksum(self) -> int:
        """xxh3-64 over every tensor's bytes: the Rust client's checksum of the same batch."""
    def row_digests(self) -> List[int]:
        """One xxh3-64 per row over its bytes of every tensor: which rows the batch holds, in order."""

class Epoch:
    """The batches of one epoch, in plan order; ``len()`` is how many it yields."""

    def __iter__(self) -> "Epoch": ...
    def __next__(self) -> Batch: ...
    def __len__(self) -> int: ...
    def state_dict(self) -> ResumeState:
        """The resume state at the next batch this iterator yields."""
    @property
    def position(self) -> Tuple[int, int]:
        """(epoch, index) of the next batch."""

class Loader:
    """One data-parallel rank's loader (see ``help(granary.Loader)``)."""

    def __init__(
        self,
        socket: _Path,
        dataset: str,
        batch_size: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        window_shards: int = 4,
        block_batches: int = 0,
        drop_last: bool = False,
        version: Optional[str] = None,
        prefetch_batches: int = 2,
        assembly_threads: int = 0,
        mapping_cache_bytes: int = 1 << 30,
        reconnect_seconds: float = 30.0,
        global_batch: Optional[int] = None,
        partitions: int = 1,
    ) -> None: ...
    @staticmethod
    def resuming(
        socket: _Path,
        state: ResumeState,
        *,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        prefetch_batches: int = 2,
        assembly_threads: int = 0,
        mapping_cache_bytes: int = 1 << 30,
        reconnect_seconds: float = 30.0,
    ) -> "Loader":
        """A loader reading what ``state`` was saved from, positioned at it."""
    def epoch(self, epoch: int) -> Epoch:
        """The batches of ``epoch`` (from the saved batch, for a loaded state's epoch)."""
    def resume(self, state: ResumeState) -> Epoch:
        """The batches from where ``state`` was saved."""
    def state_dict(self) -> ResumeState:
        """The whole resume state at the rank's next batch."""
    def load_state_dict(self, state: ResumeState) -> None:
        """Continue from ``state``: the next ``epoch(state["epoch"])`` starts at ``state["batch"]``."""
    def __len__(self) -> int: ...
    def num_batches(self, epoch: int) -> int: ...
    @property
    def version(self) -> str: ...
    @property
    def dataset(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def global_batch(self) -> Optional[int]:
        """Rows of a global step with the global plan; None with the rank plan."""
    @property
    def socket(self) -> "PathLike[str]": ...
    @property
    def total_rows(self) -> int: ...
    @property
    def tensors(self) -> List[Dict[str, Any]]:
        """Each tensor's ``name``, ``dtype`` (Granary's name) and per-row ``shape``."""

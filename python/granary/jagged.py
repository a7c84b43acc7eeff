"""Jagged tensors: rows with a variable number of values (list and byte columns)."""

import numpy as np

__all__ = ["Jagged"]


class Jagged:
    """A jagged tensor of a batch: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    ``values`` is every row's values, rows in batch order, contiguous (shape ``(n,)``, or ``(n, *shape)``
    when each value has a shape); ``offsets`` is ``rows + 1`` int64s, the first 0 and the last ``n``.
    Both are numpy views of the batch's memory, made without a copy; ``lengths`` is computed from
    ``offsets`` (one int64 per row). A byte column (``Binary``/``Utf8``) is a ``Jagged`` of uint8:
    ``bytes(j[i])`` is row ``i``'s bytes.
    """

    __slots__ = ("values", "offsets")

    def __init__(self, values, offsets):
        offsets = np.asarray(offsets)
        if offsets.ndim != 1 or len(offsets) < 1:
            raise ValueError(f"offsets must be one-dimensional with rows + 1 entries, not shape {offsets.shape}")
        if int(offsets[-1]) != len(values):
            raise ValueError(f"the last offset is {int(offsets[-1])} but there are {len(values)} values")
        self.values = values
        self.offsets = offsets

    @property
    def lengths(self):
        """Each row's length, in values (int64)."""
        return np.diff(self.offsets)

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def nbytes(self):
        """Bytes of values and offsets."""
        return self.values.nbytes + self.offsets.nbytes

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        """Row ``i``'s values (a view)."""
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} of a jagged tensor of {n} rows")
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self):
        for i in range(len(self)):
            yield self.values[self.offsets[i] : self.offsets[i + 1]]

    def tolist(self):
        """Each row's values as a list (of ``bytes`` for uint8 rows: ``[bytes(r) for r in j]`` otherwise)."""
        return [row.tolist() for row in self]

    def to_padded(self, max_len=None, fill=0):
        """A dense array of shape ``(rows, max_len, *value_shape)``: each row's first ``max_len`` values,
        then ``fill``. ``max_len`` defaults to the longest row. A copy."""
        lengths = self.lengths
        rows = len(lengths)
        if max_len is None:
            max_len = int(lengths.max()) if rows else 0
        if max_len < 0:
            raise ValueError(f"max_len must be >= 0, not {max_len}")
        out = np.full((rows, max_len) + self.values.shape[1:], fill, dtype=self.values.dtype)
        keep = np.minimum(lengths, max_len)
        total = int(keep.sum())
        if total:
            row = np.repeat(np.arange(rows), keep)
            col = np.arange(total) - np.repeat(np.cumsum(keep) - keep, keep)
            out[row, col] = self.values[self.offsets[:-1][row] + col]
        return out

    def __repr__(self):
        lengths = self.lengths
        longest = int(lengths.max()) if len(lengths) else 0
        return (
            f"<granary.Jagged {len(self)} rows of {self.values.dtype} (shape {self.values.shape[1:]} per value), "
            f"{len(self.values)} values, longest {longest}>"
        )

"""Granary's errors as Python exceptions.

Every exception raised by Granary is a :class:`GranaryError`; each carries
``retryable``: ``True`` when asking again may succeed (the node restarting,
a peer or remote storage unavailable), ``False`` for what fails the same way
again (bad parameters, an unknown dataset, a damaged chunk, a misuse). The
message is the Rust client's, which names the file, row group, column,
shard or node concerned.

Each class also derives from the built-in exception a Python caller would
expect (``ValueError`` for bad parameters, ``LookupError`` for what is not
served, ``ConnectionError`` for a node that cannot be reached), so generic
handlers keep working.
"""

__all__ = [
    "GranaryError",
    "ConfigError",
    "NodeUnavailableError",
    "NodeError",
    "CorruptChunkError",
    "ProtocolError",
    "PlanError",
    "UnknownDatasetError",
    "VersionGoneError",
    "ResumeMismatchError",
    "PositionPastEndError",
    "ForkedProcessError",
]


class GranaryError(Exception):
    """Base of every Granary error. ``retryable`` says whether asking again may succeed."""

    retryable = False


class ConfigError(GranaryError, ValueError):
    """An argument Granary cannot use (a batch size of 0, a malformed version or resume state)."""


class NodeUnavailableError(GranaryError, ConnectionError):
    """The node's socket cannot be reached, or the connection failed mid-request (the node may be restarting).

    Retryable: make a new :class:`granary.Loader` (from ``state_dict()``) once the node is back.
    """

    retryable = True


class NodeError(GranaryError):
    """The node reported a failure; ``retryable`` is true when it was temporary (a peer or remote storage
    unavailable, memory short), false for bad input (the message names file, row group and column)."""


class CorruptChunkError(GranaryError):
    """A chunk failed validation and was not used (no wrong tensor is ever delivered)."""


class ProtocolError(GranaryError):
    """The node answered something this client does not understand (a version mismatch or a bug)."""


class PlanError(GranaryError, ValueError):
    """The plan parameters are impossible (rank not below world size, a batch size of 0, ...)."""


class UnknownDatasetError(GranaryError, LookupError):
    """The node does not serve the dataset. ``dataset`` is the name asked for, ``served`` the names it serves."""

    dataset = None
    served = ()


class VersionGoneError(GranaryError, LookupError):
    """The node serves the dataset, but no longer the version the job pinned (``version``; ``current`` is
    what it serves now)."""

    dataset = None
    version = None
    current = None


class ResumeMismatchError(GranaryError, ValueError):
    """A saved state this loader would read differently: ``field`` differs (``saved`` vs ``now``)."""

    field = None
    saved = None
    now = None


class PositionPastEndError(GranaryError, IndexError):
    """A resume position after the end of its epoch."""


class ForkedProcessError(GranaryError, RuntimeError):
    """A Loader used in a process other than the one that made it (a fork, such as a DataLoader worker).

    Its node connection and assembly threads stay in the parent: make the Loader in the process that
    iterates it, or use ``DataLoader(num_workers=0)``.
    """

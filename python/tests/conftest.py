"""A Granary node serving a small generated dataset, for the Python client's tests.

The ``granary`` binary comes from ``GRANARY_BIN``, else the repository's ``target/debug`` or
``target/release`` build; without one the tests fail (they are not skipped): build it first with
``cargo build``.

A test that skips appends its name and why to ``GRANARY_SKIP_LOG`` when that is set (``.ci/run``
prints the list), so a skip never reads as a pass.
"""

import os
import pathlib
import socket
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
ROWS = 20_000
JAGGED_ROWS = 4_000
FILES = 2
ROW_GROUP_ROWS = 2_500
DATA_SEED = 3


# A view of the generated files as other dtypes: the first 8 dense features as bf16, f16 and f64,
# the ids as i32.
TYPED_VIEW = """
[[tensor]]
name = "dense_bf16"
dtype = "bf16"
columns = ["f{0..8}"]
cast = true

[[tensor]]
name = "dense_f16"
dtype = "f16"
columns = ["f{0..8}"]
cast = true

[[tensor]]
name = "dense_f64"
dtype = "f64"
columns = ["f{0..8}"]
cast = true

[[tensor]]
name = "ids32"
dtype = "i32"
columns = ["user_id", "item_id"]
cast = true
"""


def granary_bin():
    b = os.environ.get("GRANARY_BIN")
    if b:
        return b
    for p in (REPO / "target" / "debug" / "granary", REPO / "target" / "release" / "granary"):
        if p.exists():
            return str(p)
    pytest.fail("no granary binary: run `cargo build` first, or set GRANARY_BIN")


def _wait_for_socket(path, proc, log, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the node exited with {proc.returncode}:\n{log.read_text()}")
        if path.exists():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(path))
                return
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    raise RuntimeError(f"the node's socket {path} did not accept within {timeout} s:\n{log.read_text()}")


class Node:
    """A running node daemon: its socket, data folder and the binary."""

    def __init__(self, root):
        self.bin = granary_bin()
        self.root = root
        self.data = root / "data"
        self.socket = root / "node.sock"
        self.log = root / "node.log"
        subprocess.run(
            [self.bin, "dataset", "gen", "--out", str(self.data), "--rows", str(ROWS), "--files", str(FILES),
             "--row-group-rows", str(ROW_GROUP_ROWS), "--seed", str(DATA_SEED)],
            check=True, capture_output=True,
        )
        # A small dataset with list and byte columns (jagged tensors): hist, cats, blob.
        self.jagged_data = root / "jagged"
        subprocess.run(
            [self.bin, "dataset", "gen", "--out", str(self.jagged_data), "--rows", str(JAGGED_ROWS), "--files", "2",
             "--row-group-rows", "1000", "--seed", str(DATA_SEED), "--jagged"],
            check=True, capture_output=True,
        )
        # The same files as every dtype numpy has and bf16, which it lacks.
        typed = root / "typed.toml"
        typed.write_text(TYPED_VIEW)
        config = root / "node.toml"
        config.write_text(
            f'socket = "{self.socket}"\n'
            "ram_bytes = 268435456\n"
            "[[dataset]]\n"
            'name = "ads"\n'
            f'source = "file://{self.data}/"\n'
            f'view = "{self.data / "view.toml"}"\n'
            "[[dataset]]\n"
            'name = "typed"\n'
            f'source = "file://{self.data}/"\n'
            f'view = "{typed}"\n'
            "[[dataset]]\n"
            'name = "jagged"\n'
            f'source = "file://{self.jagged_data}/"\n'
            f'view = "{self.jagged_data / "view.toml"}"\n'
        )
        env = dict(os.environ, GRANARY_LOG=os.environ.get("GRANARY_LOG", "warn"), RUST_BACKTRACE="0")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([self.bin, "node", "--config", str(config)], stdout=out, stderr=out, env=env)
        _wait_for_socket(self.socket, self.proc, self.log)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def node(tmp_path_factory):
    n = Node(tmp_path_factory.mktemp("granary"))
    yield n
    n.stop()


def pytest_runtest_logreport(report):
    if report.skipped and os.environ.get("GRANARY_SKIP_LOG"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        with open(os.environ["GRANARY_SKIP_LOG"], "a") as f:
            f.write(f"python {report.nodeid}: {reason}\n")

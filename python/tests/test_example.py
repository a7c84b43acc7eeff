"""examples/ddp_train.py: two DDP processes (gloo, CPU) train through Granary; a run stopped after a
checkpoint and resumed gives the uninterrupted run's loss curve, step for step."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not importable (Debian: apt-get install python3-torch)")

from conftest import REPO  # noqa: E402

EXAMPLE = REPO / "examples" / "ddp_train.py"


def run(node, *args):
    cmd = [sys.executable, str(EXAMPLE), "--socket", str(node.socket), "--batch-size", "500", "--epochs", "2",
           "--checkpoint-every", "5", "--stuck-after", "120", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_resumed_ddp_run_repeats_the_uninterrupted_loss_curve(node, tmp_path):
    full, cut, ck = tmp_path / "full.txt", tmp_path / "cut.txt", str(tmp_path / "ck.pt")
    run(node, "--losses", str(full))
    curve = full.read_text().splitlines()
    # 20,000 rows, 2 ranks of 500 rows a batch: 20 steps an epoch.
    assert len(curve) == 40 and curve[0].startswith("0 1 ") and curve[-1].startswith("1 40 ")
    # Stopped mid-epoch 1 right after the checkpoint at step 25, then resumed.
    run(node, "--losses", str(cut), "--checkpoint", ck, "--stop-after", "25")
    assert os.path.exists(ck) and not cut.exists()
    run(node, "--losses", str(cut), "--checkpoint", ck, "--resume")
    assert cut.read_text().splitlines() == curve
    # The loss went down: it trained.
    first, last = float(curve[0].split()[2]), float(curve[-1].split()[2])
    assert last < first

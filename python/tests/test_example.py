"""examples/ddp_train.py: two DDP processes (gloo, CPU) train through Granary; a run stopped after a
checkpoint and resumed gives the uninterrupted run's loss curve, step for step; with the global plan, a
run stopped on 4 processes and resumed on 2 gives it within float rounding."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not importable (Debian: apt-get install python3-torch)")

from conftest import REPO  # noqa: E402

EXAMPLE = REPO / "examples" / "ddp_train.py"


def run(node, *args, batch=("--batch-size", "500")):
    cmd = [sys.executable, str(EXAMPLE), "--socket", str(node.socket), *batch, "--epochs", "2",
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


def test_a_global_plan_run_stopped_on_4_processes_resumes_on_2_with_the_same_loss_curve(node, tmp_path):
    full, cut, ck = tmp_path / "full.txt", tmp_path / "cut.txt", str(tmp_path / "ck.pt")
    glob = ("--global-batch", "1000", "--partitions", "4")
    run(node, "--losses", str(full), "--world-size", "4", batch=glob)
    curve = [line.split() for line in full.read_text().splitlines()]
    # 20,000 rows in global steps of 1,000: 20 steps an epoch, whatever the world size.
    assert len(curve) == 40 and curve[-1][:2] == ["1", "40"]
    run(node, "--losses", str(cut), "--checkpoint", ck, "--stop-after", "25", "--world-size", "4", batch=glob)
    run(node, "--losses", str(cut), "--checkpoint", ck, "--resume", "--world-size", "2", batch=glob)
    resumed = [line.split() for line in cut.read_text().splitlines()]
    assert [r[:2] for r in resumed] == [c[:2] for c in curve]
    # The same rows every step: the mean loss differs only by the order of float sums.
    for (e, s, a), (_, _, b) in zip(curve, resumed):
        assert float(a) == pytest.approx(float(b), rel=1e-5, abs=1e-7), f"epoch {e} step {s}: {a} vs {b}"
    assert float(curve[-1][2]) < float(curve[0][2])

"""`granary bench python`: the Python client against the Rust client and numpy, in one run (a small
dataset here; docs/BENCHMARKS.md has the figures), and what it says when Python lacks the package."""

import json
import os
import subprocess
import sys

import pytest

from conftest import granary_bin


@pytest.mark.parametrize("jagged", [False, True], ids=["fixed", "jagged"])
def test_bench_python_compares_the_clients_on_the_same_node_and_data(tmp_path, jagged):
    rows = 8000 if jagged else 40000
    cmd = [granary_bin(), "bench", "python", "--rows", str(rows), "--epochs", "2", "--json", "--python", sys.executable]
    out = subprocess.run(
        cmd + (["--jagged"] if jagged else []),
        capture_output=True, text=True, timeout=600, env=dict(os.environ, RUST_BACKTRACE="0"), cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [d["scenario"] for d in lines] == ["rust", "python", "rust_copy", "python_copy", "numpy_copy", "summary"]
    for d in lines[:-1]:
        assert d["rows_per_s"] > 0 and len(d["epochs"]) == 2 and all(e["rows"] == rows for e in d["epochs"])
    # Every scenario moved the same bytes (a jagged tensor's offsets and values).
    assert len({d["epochs"][0]["bytes"] for d in lines[:-1]}) == 1, [d["epochs"][0]["bytes"] for d in lines[:-1]]
    s = lines[-1]
    assert s["streams_identical"] is True
    assert s["python_vs_rust"] > 0 and s["python_vs_numpy_copy"] > 0 and s["python_ready_us"] > 0


def test_bench_python_says_how_to_install_the_package(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    out = subprocess.run([granary_bin(), "bench", "python", "--python", str(bare / "bin" / "python")],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, RUST_BACKTRACE="0"))
    assert out.returncode != 0
    assert "cannot import granary" in out.stderr and "pip install ./python" in out.stderr, out.stderr
    out = subprocess.run([granary_bin(), "bench", "python", "--python", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, RUST_BACKTRACE="0"))
    assert out.returncode != 0 and "--python" in out.stderr, out.stderr

"""Faults and signals, as real processes: SIGTERM, two sweeps on one store, Dask (issue 20).

Each test runs ``offsim sweep`` as a subprocess on a spec of 40 Llama-2 7B points (about 70 ms
each), waits until some points are stored, then does what a user, a batch scheduler or a
failing cluster would do.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

POINTS = 40
SPEC = f"""schema_version: 1
name: slow-grid
description: {POINTS} ZeRO-Infinity points, slow enough to interrupt.
base:
  hardware: rtx4090-pcie4-ws
  workload: llama2-7b
  strategy: zero-infinity-nvme
  iterations: 2
  warmup_iterations: 1
grid:
  cpu_cores: [{", ".join(str(8 + i) for i in range(POINTS))}]
"""  # CPU cores: every point's run differs (a sweep reuses the run of points whose runs are equal)


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "slow-grid.yaml"
    path.write_text(SPEC)
    return path


def _offsim(*args: str) -> list[str]:
    """The ``offsim`` command line, run by this interpreter."""
    return [sys.executable, "-c", "from offsim.cli import app; app(prog_name='offsim')", *args]


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(_offsim(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stored(out: Path) -> int:
    db = out / "results.sqlite"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return int(con.execute("SELECT COUNT(*) FROM points").fetchone()[0])
    except sqlite3.OperationalError:  # the table is not there yet
        return 0


def _wait_for_points(out: Path, n: int, proc: subprocess.Popen[str], limit_s: float = 60) -> None:
    end = time.monotonic() + limit_s
    while _stored(out) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "no points stored in time"
        time.sleep(0.05)


def _point_ids(out: Path) -> list[str]:
    with sqlite3.connect(out / "results.sqlite") as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return [pid for (pid,) in con.execute("SELECT point_id FROM points")]


def test_sigterm_stops_a_sweep_consistently_and_a_rerun_resumes(spec: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _start("sweep", str(spec), "-o", str(out), "--workers", "1", "--no-prefilter")
    _wait_for_points(out, 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert "stopped by SIGTERM" in stderr and "run the same command again to resume" in stderr
    assert "Traceback" not in stderr
    kept = _point_ids(out)
    assert 2 <= len(kept) < POINTS
    again = subprocess.run(_offsim("sweep", str(spec), "-o", str(out), "--workers", "1", "--no-prefilter",
                                   "--json"), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f'"reused": {len(kept)}' in again.stdout
    ids = _point_ids(out)
    assert len(ids) == len(set(ids)) == POINTS


def test_a_second_sweep_on_the_same_store_is_refused(spec: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = _start("sweep", str(spec), "-o", str(out), "--workers", "1", "--no-prefilter")
    _wait_for_points(out, 1, first)
    second = subprocess.run(_offsim("sweep", str(spec), "-o", str(out), "--workers", "1", "--no-prefilter"),
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stderr
    assert "another sweep is writing this results store" in second.stderr
    assert f"pid {first.pid}" in second.stderr
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    ids = _point_ids(out)
    assert len(ids) == len(set(ids)) == POINTS


def test_an_unreachable_dask_scheduler_fails_within_seconds(spec: Path, tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"  # nothing listens there
    t0 = time.monotonic()
    done = subprocess.run(_offsim("sweep", str(spec), "-o", str(tmp_path / "out"), "--scheduler", address),
                          capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 15
    assert done.returncode == 2
    assert f"--scheduler {address}: cannot reach a Dask scheduler" in done.stderr
    assert "Traceback" not in done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def dask_cluster() -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A Dask scheduler and two single-threaded workers without nannies (a killed one stays dead)."""
    pytest.importorskip("distributed")
    dask = shutil.which("dask")
    if dask is None:
        pytest.skip("the dask command is not installed")
    address = f"tcp://127.0.0.1:{_free_port()}"
    port = address.rsplit(":", 1)[1]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", port, "--no-dashboard"],
                              **quiet)]
    try:
        workers = [subprocess.Popen([dask, "worker", address, "--nthreads", "1", "--no-nanny",
                                     "--no-dashboard"], **quiet) for _ in range(2)]
        procs += workers
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
        yield address, workers
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_lost_dask_worker_is_retried_and_every_point_is_stored_once(
    spec: Path, tmp_path: Path, dask_cluster: tuple[str, list[subprocess.Popen[bytes]]]
) -> None:
    address, workers = dask_cluster
    out = tmp_path / "out"
    proc = _start("sweep", str(spec), "-o", str(out), "--scheduler", address, "--no-prefilter")
    _wait_for_points(out, 1, proc)
    os.kill(workers[0].pid, signal.SIGKILL)  # a worker lost mid-sweep, its chunk in flight
    assert proc.poll() is None and _stored(out) < POINTS  # the kill did land mid-sweep
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    ids = _point_ids(out)
    assert len(ids) == len(set(ids)) == POINTS

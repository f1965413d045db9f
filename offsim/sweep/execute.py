"""Running a sweep: local processes by default, or an existing Dask cluster; resumable.

* **Backends.** ``workers=1`` evaluates in this process (tests, debugging); ``workers=N`` uses a
  :class:`concurrent.futures.ProcessPoolExecutor` (default: one process per core);
  ``scheduler=ADDRESS`` submits the same chunks to a running ``dask.distributed`` cluster (the
  payload is scattered to every worker once). There is no other job system.
* **Chunks.** Points travel in small chunks (at most :data:`MAX_CHUNK`) so that per-task
  overhead stays small while each finished chunk is stored at once.
* **Waves.** With the pre-filter on and prices known, points are ordered by hourly price and
  processed in waves of :data:`WAVE_POINTS`; a wave's dominance test uses the points simulated in
  earlier waves only. Wave boundaries depend on the spec alone, never on timing or on the number
  of workers, so an interrupted and resumed sweep makes the same decisions as an uninterrupted
  one.
* **Resuming.** Points already in the store are skipped (:mod:`offsim.sweep.store`).
"""

from __future__ import annotations

import abc

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from offsim.sweep.evaluate import Payload, point_usd_per_hour, run_chunk
from offsim.sweep.prefilter import Frontier
from offsim.sweep.spec import Point, SweepPlan
from offsim.sweep.store import ResultStore, rows_to_frame

#: Points per dominance wave (fixed, so that decisions do not depend on the machine).
WAVE_POINTS = 256
#: Most points sent to a worker at once.
MAX_CHUNK = 16

Items = list[tuple[int, str, dict[str, Any]]]


@dataclass
class SweepOutcome:
    """What :func:`run_sweep` did.

    Attributes:
        frame: the result table read back from the store (every stored point of this sweep).
        out: the output folder.
        total: points in the sweep.
        new: points evaluated by this call.
        reused: points found in the store.
        complete: every point is stored.
        interrupted: stopped by Ctrl-C.
        failed_chunks: chunks lost to a worker failure (not stored: a rerun retries them).
        elapsed_s: wall time of this call.
        files: files written (tables, figures).
    """

    frame: pd.DataFrame
    out: Path
    total: int
    new: int = 0
    reused: int = 0
    complete: bool = False
    interrupted: bool = False
    failed_chunks: int = 0
    elapsed_s: float = 0.0
    files: list[Path] = field(default_factory=list)

    @property
    def points_per_s(self) -> float:
        """Points evaluated per second of wall time by this call."""
        return self.new / self.elapsed_s if self.elapsed_s > 0 else 0.0


# ----------------------------------------------------------------------------- backends
_WORKER_PAYLOAD: Payload | None = None


def _init_worker(payload: Payload, parent_pid: int) -> None:
    """Keep the payload for this worker process; exit when the sweep's process is gone.

    A killed sweep (SIGKILL, a closed terminal) cannot shut its pool down, so each worker
    watches its parent and leaves on its own instead of lingering.
    """
    global _WORKER_PAYLOAD  # the pool's way to share one payload per process
    _WORKER_PAYLOAD = payload

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=watch, name="offsim-parent-watch", daemon=True).start()


def _run_chunk_in_pool(items: Items, frontier: Frontier | None) -> list[dict[str, Any]]:
    assert _WORKER_PAYLOAD is not None
    return run_chunk(_WORKER_PAYLOAD, items, frontier)


class Backend(abc.ABC):
    """Runs chunks somewhere and yields ``(items, rows or exception)`` as they finish."""

    workers: int = 1

    @abc.abstractmethod
    def run(self, chunks: list[Items], frontier: Frontier | None) -> Iterator[tuple[Items, Any]]:
        """Evaluate ``chunks``; yield each with its rows (or the exception that lost it)."""

    def close(self) -> None:
        """Release processes or connections."""


class InlineBackend(Backend):
    """Evaluates in this process, one chunk after another."""

    def __init__(self, payload: Payload) -> None:
        self.payload = payload

    def run(self, chunks: list[Items], frontier: Frontier | None) -> Iterator[tuple[Items, Any]]:
        for items in chunks:
            yield items, run_chunk(self.payload, items, frontier)


class PoolBackend(Backend):
    """A local process pool; each process receives the payload once, when it starts."""

    def __init__(self, payload: Payload, workers: int) -> None:
        import multiprocessing

        self.workers = workers
        ctx = multiprocessing.get_context("spawn")  # no inherited threads or locks, no fork server to linger
        self.pool = ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(payload, os.getpid())
        )

    def run(self, chunks: list[Items], frontier: Frontier | None) -> Iterator[tuple[Items, Any]]:
        pending: dict[Future, Items] = {}
        queue = list(reversed(chunks))
        try:
            while queue or pending:
                while queue and len(pending) < 2 * self.workers:  # keep every worker fed
                    items = queue.pop()
                    try:
                        pending[self.pool.submit(_run_chunk_in_pool, items, frontier)] = items
                    except BrokenProcessPool as exc:  # a worker died: what is left is retried by a rerun
                        yield items, exc
                if not pending:
                    continue
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    items = pending.pop(fut)
                    exc = fut.exception()
                    yield items, (exc if exc is not None else fut.result())
        finally:
            for fut in pending:
                fut.cancel()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class DaskBackend(Backend):
    """An existing ``dask.distributed`` cluster at ``address`` (or a Client/LocalCluster given)."""

    def __init__(self, payload: Payload, address: Any) -> None:
        from distributed import Client

        self.own = not isinstance(address, Client)
        self.client = Client(address) if self.own else address
        self.workers = max(
            1, sum(w.get("nthreads", 1) for w in self.client.scheduler_info()["workers"].values())
        )
        [self.payload] = self.client.scatter([payload], broadcast=True, hash=False)

    def run(self, chunks: list[Items], frontier: Frontier | None) -> Iterator[tuple[Items, Any]]:
        from distributed import as_completed

        futures = {
            self.client.submit(run_chunk, self.payload, items, frontier, pure=False): items
            for items in chunks
        }
        try:
            for fut in as_completed(futures):
                items = futures[fut]
                try:
                    yield items, fut.result()
                except Exception as exc:  # a lost worker: the chunk is retried by a rerun
                    yield items, exc
        finally:
            for fut in futures:
                fut.cancel()

    def close(self) -> None:
        if self.own:
            self.client.close()


def make_backend(payload: Payload, workers: int | None = None, scheduler: Any = None) -> Backend:
    """Inline for one worker, a process pool for more, Dask when a scheduler is given."""
    if scheduler is not None:
        return DaskBackend(payload, scheduler)
    n = workers or os.cpu_count() or 1
    return InlineBackend(payload) if n <= 1 else PoolBackend(payload, n)


# ----------------------------------------------------------------------------- ordering
def plan_waves(plan: SweepPlan, prefilter: bool) -> list[list[Point]]:
    """Points in evaluation order, cut into waves (one wave when dominance cannot apply)."""
    if not prefilter:
        return [plan.points]
    cache: dict[str, float | None] = {}
    costs = [point_usd_per_hour(plan, p.overrides, cache) for p in plan.points]
    if all(c is None for c in costs):
        return [plan.points]
    order = sorted(range(len(plan.points)), key=lambda i: (costs[i] is None, costs[i] or 0.0, i))
    pts = [plan.points[i] for i in order]
    return [pts[i : i + WAVE_POINTS] for i in range(0, len(pts), WAVE_POINTS)]


def _chunks(points: list[Point], workers: int) -> list[Items]:
    size = max(1, min(MAX_CHUNK, math.ceil(len(points) / (4 * workers))))
    return [
        [(p.index, p.point_id, p.overrides) for p in points[i : i + size]]
        for i in range(0, len(points), size)
    ]


# ----------------------------------------------------------------------------- running
def store_meta(plan: SweepPlan, prefilter: bool) -> dict[str, str]:
    """What identifies a sweep's results in the store."""
    return {
        "fingerprint": plan.fingerprint(),
        "prefilter": str(prefilter),
        "points": plan.point_set_digest(),
        "name": plan.name,
        "source": plan.source,
    }


def run_sweep(
    plan: SweepPlan,
    out: str | Path,
    *,
    workers: int | None = None,
    scheduler: Any = None,
    prefilter: bool = True,
    max_points: int | None = None,
    fresh: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SweepOutcome:
    """Evaluate every point of ``plan`` not yet stored in ``out``; return the full table.

    Args:
        workers: local processes (default: the machine's cores; 1 runs in this process).
        scheduler: a Dask scheduler address (``tcp://host:8786``) or a ``distributed.Client``.
        prefilter: skip the simulation of points the closed-form checks settle.
        max_points: evaluate at most this many new points, then stop (as if interrupted).
        fresh: discard what the store holds first.
        progress: called with ``(points stored, total)`` after each chunk.
    """
    t0 = time.perf_counter()
    out = Path(out)
    outcome = SweepOutcome(pd.DataFrame(), out, len(plan.points))
    with ResultStore(out) as store:
        store.claim(store_meta(plan, prefilter), fresh=fresh)
        ids = {p.point_id for p in plan.points}
        done = store.done_ids() & ids
        outcome.reused = len(done)
        if progress:
            progress(len(done), len(plan.points))
        budget = math.inf if max_points is None else max_points
        payload = Payload.from_plan(plan, prefilter)
        waves = plan_waves(plan, prefilter)
        backend = make_backend(payload, workers, scheduler) if len(done) < len(ids) and budget > 0 else None
        keep = ("point_id", "status", "usd_per_hour", "tokens_per_s", "workload_id")
        known = (
            {r["point_id"]: {k: r.get(k) for k in keep} for r in store.rows(done)} if len(waves) > 1 else {}
        )
        try:
            seen: list[Point] = []
            for wave in waves:
                todo = [p for p in wave if p.point_id not in done]
                if todo and budget > 0 and backend is not None:
                    todo = todo[: int(min(budget, len(todo)))]
                    frontier = (
                        Frontier.from_rows(known[p.point_id] for p in seen if p.point_id in known)
                        if len(waves) > 1
                        else None
                    )
                    for _items, rows in backend.run(_chunks(todo, backend.workers), frontier):
                        if isinstance(rows, BaseException):
                            outcome.failed_chunks += 1
                            continue
                        store.write(rows)
                        if len(waves) > 1:
                            known.update((r["point_id"], {k: r.get(k) for k in keep}) for r in rows)
                        done.update(r["point_id"] for r in rows)
                        outcome.new += len(rows)
                        budget -= len(rows)
                        if progress:
                            progress(len(done), len(plan.points))
                if outcome.failed_chunks and len(waves) > 1:
                    break  # later waves' dominance tests need this wave complete: a rerun resumes here
                seen.extend(wave)
        except KeyboardInterrupt:
            outcome.interrupted = True
        finally:
            if backend is not None:
                backend.close()
        outcome.complete = len(done) >= len(ids)
        outcome.frame = rows_to_frame(store.rows(ids), plan.axis_keys)
    outcome.elapsed_s = time.perf_counter() - t0
    return outcome


def write_tables(frame: pd.DataFrame, out: Path) -> list[Path]:
    """``results.parquet`` and ``results.csv`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    csv, parquet = out / "results.csv", out / "results.parquet"
    frame.to_csv(csv, index=False)
    safe = frame.copy()
    for col in safe.columns:  # Parquet wants one type per column: mixed axis values become text
        if safe[col].dtype == object:
            kinds = {type(v) for v in safe[col] if v is not None and v == v}
            if len(kinds) > 1:
                safe[col] = safe[col].map(lambda v: None if v is None or v != v else str(v))
    safe.to_parquet(parquet, index=False)
    return [csv, parquet]

"""Running a sweep: local processes by default, or an existing Dask cluster; resumable.

* **Backends.** ``workers=1`` evaluates in this process (tests, debugging); ``workers=N`` uses a
  :class:`concurrent.futures.ProcessPoolExecutor` (default: one process per core);
  ``scheduler=ADDRESS`` submits the same chunks to a running ``dask.distributed`` cluster (the
  payload is scattered to every worker once). There is no other job system.
* **Chunks.** Points that differ only in hardware axes travel together (at most
  :data:`GROUP_CHUNK`), so that one worker composes and runs once what they share; other points
  travel :data:`MAX_CHUNK` at a time. Each finished chunk is stored at once; a Dask task is a chunk.
* **Waves.** With the pre-filter on and prices known, points are ordered by hourly price and
  processed in waves of :data:`WAVE_POINTS`; a wave's dominance test uses the points simulated in
  earlier waves only. Wave boundaries depend on the spec alone, never on timing or on the number
  of workers, so an interrupted and resumed sweep makes the same decisions as an uninterrupted
  one.
* **Resuming.** Points already in the store are skipped (:mod:`offsim.sweep.store`).
* **Stopping.** Ctrl-C and SIGTERM (a batch scheduler's or a container's stop) stop the sweep the
  same way: chunks in flight are dropped, everything stored stays stored, and a rerun resumes.
* **One writer.** A sweep holds the store's lock while it runs; a second sweep on the same folder
  is refused with a message instead of computing the same points again.
"""

from __future__ import annotations

import abc
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from offsim.engine import reuse
from offsim.errors import ConfigError
from offsim.sweep.evaluate import Payload, column_value, point_usd_per_hour, run_chunk
from offsim.sweep.prefilter import Frontier
from offsim.sweep.spec import Point, SweepPlan
from offsim.sweep.store import ResultStore, rows_to_frame

#: Points per dominance wave (fixed, so that decisions do not depend on the machine).
WAVE_POINTS = 256
#: Most points sent to a worker at once, where they share no composition.
MAX_CHUNK = 16
#: Most points of one group sent to a worker at once: points that differ only in hardware axes
#: go together, so that one worker composes, compiles and runs what they share once (issue 16:
#: dealt 16 at a time, the points that share a composition or a run, hundreds apart in grid
#: order, went to every worker and each composed and ran them again), and a Dask task is a batch
GROUP_CHUNK = 256
#: Seconds to wait for a Dask scheduler before giving up with a message.
DASK_CONNECT_TIMEOUT_S = 5.0
#: Times Dask reruns a chunk whose task raised (a lost worker is rescheduled by Dask itself).
DASK_RETRIES = 2

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
        interrupted: stopped by Ctrl-C or SIGTERM.
        signal_name: ``SIGINT`` or ``SIGTERM`` when interrupted.
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
    signal_name: str | None = None
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
    reuse.enable()  # points whose runs have the same inputs share one run (offsim.engine.reuse)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides

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


#: the runs a Dask worker's chunks reuse (a worker may be a thread of a process that runs other work)
_DASK_MEMO = reuse.RunMemo()


def _run_chunk_reusing(payload: Payload, items: Items, frontier: Frontier | None) -> list[dict[str, Any]]:
    """:func:`run_chunk` on a Dask worker, reusing the runs of the worker's earlier points."""
    with reuse.reusing(_DASK_MEMO):
        return run_chunk(payload, items, frontier)


class Backend(abc.ABC):
    """Runs chunks somewhere and yields ``(items, rows or exception)`` as they finish."""

    workers: int = 1

    @abc.abstractmethod
    def run(self, chunks: list[Items], frontier: Frontier | None) -> Iterator[tuple[Items, Any]]:
        """Evaluate ``chunks``; yield each with its rows (or the exception that lost it)."""

    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing
        """Release processes or connections."""


class InlineBackend(Backend):
    """Evaluates in this process, one chunk after another."""

    def __init__(self, payload: Payload) -> None:
        self.payload = payload
        self.memo = reuse.RunMemo()  # the runs of this sweep's points, kept between chunks

    def run(self, chunks: list[Items], frontier: Frontier | None) -> Iterator[tuple[Items, Any]]:
        for items in chunks:
            with reuse.reusing(self.memo):
                rows = run_chunk(self.payload, items, frontier)
            yield items, rows


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
                    err = fut.exception()
                    yield items, (err if err is not None else fut.result())
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
        self.client = _connect(address) if self.own else address
        self.workers = max(
            1, sum(w.get("nthreads", 1) for w in self.client.scheduler_info()["workers"].values())
        )
        [self.payload] = self.client.scatter([payload], broadcast=True, hash=False)

    def run(self, chunks: list[Items], frontier: Frontier | None) -> Iterator[tuple[Items, Any]]:
        from distributed import as_completed

        futures = {
            self.client.submit(
                _run_chunk_reusing, self.payload, items, frontier, pure=False, retries=DASK_RETRIES
            ): items
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


def _connect(address: str) -> Any:
    """A ``distributed.Client`` for ``address``; failing within seconds, naming the address."""
    from distributed import Client

    try:
        return Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
    except Exception as exc:  # OSError, TimeoutError, ValueError for a malformed address, ...
        raise ConfigError(
            f"--scheduler {address}: cannot reach a Dask scheduler there within "
            f"{DASK_CONNECT_TIMEOUT_S:g} s ({type(exc).__name__}: {exc}); check that 'dask scheduler' "
            "is running, the address and port (tcp://HOST:8786), and that no firewall is in the way"
        ) from None


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


def _chunks(points: list[Point], workers: int, hardware_keys: frozenset[str] = frozenset()) -> list[Items]:
    """``points`` in chunks for ``workers``: those that agree on every axis outside
    ``hardware_keys`` (a group) go together, at most :data:`GROUP_CHUNK` and a quarter of a
    worker's share at once (points of one group share their workload and strategy: often their
    composition and their runs); groups of one point are packed :data:`MAX_CHUNK` at a time.
    Groups keep the order of their first point, points their order within the group."""
    groups: dict[tuple[Any, ...], list[Point]] = {}
    for p in points:
        key = tuple((k, column_value(v)) for k, v in p.overrides.items() if k not in hardware_keys)
        groups.setdefault(key, []).append(p)
    share = max(1, math.ceil(len(points) / (4 * workers)))
    size = max(1, min(GROUP_CHUNK, share))
    small = max(1, min(MAX_CHUNK, share))
    chunks: list[Items] = []
    loose: list[Point] = []  # groups too small to share anything, packed together
    for group in groups.values():
        if len(group) <= small // 2:
            loose.extend(group)
            continue
        chunks.extend(_items(group[i : i + size]) for i in range(0, len(group), size))
    chunks.extend(_items(loose[i : i + small]) for i in range(0, len(loose), small))
    return chunks


def _items(points: list[Point]) -> Items:
    return [(p.index, p.point_id, p.overrides) for p in points]


def hardware_axis_keys(plan: SweepPlan) -> frozenset[str]:
    """The keys of ``plan``'s axes that change only the hardware section."""
    return frozenset(a.key for a in plan.axes if a.section == "hardware")


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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would raise :class:`KeyboardInterrupt`."""


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM interrupts like Ctrl-C (:class:`Terminated`); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@dataclass
class _Progress:
    """What one call has stored so far, and how much more it may evaluate."""

    plan: SweepPlan
    store: ResultStore
    outcome: SweepOutcome
    done: set[str]
    budget: float
    known: dict[str, dict[str, Any]] | None  # what dominance tests need, when there are waves
    report: Callable[[int, int], None] | None

    KEEP = ("point_id", "status", "usd_per_hour", "tokens_per_s", "workload_id")

    def record(self, rows: list[dict[str, Any]]) -> None:
        """Store a finished chunk (committed at once) and count it."""
        self.store.write(rows)
        if self.known is not None:
            self.known.update((r["point_id"], {k: r.get(k) for k in self.KEEP}) for r in rows)
        self.done.update(r["point_id"] for r in rows)
        self.outcome.new += len(rows)
        self.budget -= len(rows)
        self.tell()

    def tell(self) -> None:
        """Report ``(points stored, total)``."""
        if self.report:
            self.report(len(self.done), len(self.plan.points))


def _run_wave(state: _Progress, backend: Backend, wave: list[Point], seen: list[Point], waves: int) -> None:
    """Evaluate the points of ``wave`` not yet stored, within the budget; store each chunk."""
    todo = [p for p in wave if p.point_id not in state.done]
    if not todo or state.budget <= 0:
        return
    todo = todo[: int(min(state.budget, len(todo)))]
    frontier = None
    if waves > 1:  # dominance by the points of earlier waves only
        known = state.known or {}
        frontier = Frontier.from_rows(known[p.point_id] for p in seen if p.point_id in known)
    chunks = _chunks(todo, backend.workers, hardware_axis_keys(state.plan))
    for _done, rows in backend.run(chunks, frontier):
        if isinstance(rows, BaseException):
            state.outcome.failed_chunks += 1
            continue
        state.record(rows)


def _evaluate(state: _Progress, backend: Backend | None, waves: list[list[Point]]) -> None:
    """Run the waves in order; stop after a wave that lost chunks (later waves depend on it)."""
    seen: list[Point] = []
    for wave in waves:
        if backend is not None:
            _run_wave(state, backend, wave, seen, len(waves))
        if state.outcome.failed_chunks and len(waves) > 1:
            break  # later waves' dominance tests need this wave complete: a rerun resumes here
        seen.extend(wave)


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

    Ctrl-C and SIGTERM stop it with what is stored kept (``outcome.interrupted``); a second
    sweep on the same ``out`` while this one runs is refused (:class:`ConfigError`).

    Args:
        workers: local processes (default: the machine's cores; 1 runs in this process).
        scheduler: a Dask scheduler address (``tcp://host:8786``) or a ``distributed.Client``.
        prefilter: settle without simulating the points that do not fit in memory (the footprint
            check) or whose time bound, read off the compiled schedule
            (:func:`~offsim.plan.time_bound.time_lower_bound`), is dominated by a point already
            simulated.
        max_points: evaluate at most this many new points, then stop (as if interrupted).
        fresh: discard what the store holds first.
        progress: called with ``(points stored, total)`` after each chunk.
    """
    t0 = time.perf_counter()
    outcome = SweepOutcome(pd.DataFrame(), Path(out), len(plan.points))
    with ResultStore(out) as store, store.exclusive(), stop_on_sigterm():
        store.claim(store_meta(plan, prefilter), fresh=fresh)
        ids = {p.point_id for p in plan.points}
        done = store.done_ids() & ids
        outcome.reused = len(done)
        waves = plan_waves(plan, prefilter)
        known = None
        if len(waves) > 1:
            known = {r["point_id"]: {k: r.get(k) for k in _Progress.KEEP} for r in store.rows(done)}
        state = _Progress(plan, store, outcome, done, math.inf if max_points is None else max_points,
                          known, progress)
        state.tell()
        backend = None
        try:
            if len(done) < len(ids) and state.budget > 0:
                backend = make_backend(Payload.from_plan(plan, prefilter), workers, scheduler)
            _evaluate(state, backend, waves)
        except KeyboardInterrupt as exc:
            outcome.interrupted = True
            outcome.signal_name = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
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

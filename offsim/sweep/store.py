"""The results store: one SQLite file in the output folder, one row per finished point.

Rows are written (and committed) as soon as their chunk comes back, so killing a sweep loses at
most the chunks in flight. On a restart the points whose ``point_id`` is already stored are
skipped; the final table is always read back from the store, ordered by ``point_index``, so an
interrupted-and-resumed sweep ends with the same table as an uninterrupted one.

The store remembers the sweep's *fingerprint* (a hash of the base configuration, the cost
assumptions and the offsim version) and whether the pre-filter was on; resuming with a different
one is refused rather than mixing incompatible rows. Run-to-run timings (``wall_s``) are kept
in their own column, outside the result table.

One sweep writes a store at a time: :meth:`ResultStore.exclusive` takes an OS file lock
(``results.lock``, released by the kernel even when the process is killed), and a second sweep on
the same folder is refused with a message naming the one that holds it.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from offsim.errors import ConfigError

STORE_NAME = "results.sqlite"
LOCK_NAME = "results.lock"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS points (
    point_id TEXT PRIMARY KEY,
    point_index INTEGER NOT NULL,
    status TEXT NOT NULL,
    row TEXT NOT NULL,
    wall_s REAL
);
"""


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return str(obj)


class ResultStore:
    """Finished points of one sweep, in ``<folder>/results.sqlite``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / STORE_NAME
        self.db = sqlite3.connect(self.path)
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the store's lock for the block; refuse when another sweep holds it.

        Where the OS has no ``fcntl`` (Windows) the block runs unlocked.
        """
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on POSIX
            yield
            return
        lock_path = self.folder / LOCK_NAME
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                raise ConfigError(
                    f"{self.folder}: another sweep is writing this results store ({holder}); wait for "
                    "it to finish (then rerun to pick up what it did) or choose another --out folder"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    # ------------------------------------------------------------------ meta
    def meta(self) -> dict[str, str]:
        """Stored metadata (fingerprint, pre-filter flag, point-set digest, spec name)."""
        return dict(self.db.execute("SELECT key, value FROM meta").fetchall())

    def claim(self, meta: dict[str, str], *, fresh: bool = False) -> None:
        """Make this store hold results of the sweep described by ``meta``.

        A store of another sweep (different fingerprint or pre-filter setting) is refused
        unless ``fresh``, which discards it.
        """
        old = self.meta()
        if fresh:
            self.db.execute("DELETE FROM points")
            self.db.execute("DELETE FROM meta")
            old = {}
        for key in ("fingerprint", "prefilter"):
            if key in old and old[key] != meta[key]:
                what = (
                    "base configuration, cost assumptions or offsim version"
                    if key == "fingerprint"
                    else "--prefilter/--no-prefilter setting"
                )
                raise ConfigError(
                    f"{self.path} holds results of a sweep with a different {what}; "
                    "choose another --out folder or pass --fresh to discard them"
                )
        if old.get("points") not in (None, meta.get("points")):
            # the point set changed: pre-filter 'dominated' verdicts depended on the old set
            self.db.execute("DELETE FROM points WHERE status = 'dominated'")
        self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", sorted(meta.items()))
        self.db.commit()

    # ------------------------------------------------------------------ rows
    def write(self, rows: Iterable[dict[str, Any]]) -> None:
        """Store finished rows and commit at once."""
        data = []
        for r in rows:
            r = dict(r)
            wall = r.pop("wall_s", None)
            data.append(
                (
                    r["point_id"],
                    r["point_index"],
                    r["status"],
                    json.dumps(r, default=_json_default, allow_nan=True),  # read back by Python only
                    wall,
                )
            )
        with self.db:  # one transaction: a chunk is stored whole or not at all
            self.db.executemany("INSERT OR REPLACE INTO points VALUES (?, ?, ?, ?, ?)", data)

    def done_ids(self) -> set[str]:
        """Ids of the stored points."""
        return {pid for (pid,) in self.db.execute("SELECT point_id FROM points")}

    def rows(self, ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Stored rows (all, or those of ``ids``), ordered by point index."""
        cur = self.db.execute("SELECT point_id, row FROM points ORDER BY point_index")
        wanted = None if ids is None else set(ids)
        return [json.loads(row) for pid, row in cur if wanted is None or pid in wanted]

    def wall_times(self) -> pd.Series:
        """Seconds each stored point took to evaluate, by point id."""
        cur = self.db.execute("SELECT point_id, wall_s FROM points ORDER BY point_index")
        return pd.Series(dict(cur.fetchall()), name="wall_s", dtype=float)

    def count(self) -> int:
        """Number of stored points."""
        return int(self.db.execute("SELECT COUNT(*) FROM points").fetchone()[0])


def rows_to_frame(rows: list[dict[str, Any]], axis_keys: list[str]) -> pd.DataFrame:
    """The tidy table: one row per point, axis columns first, ordered by point index."""
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    lead = ["point_index", "point_id", *axis_keys, "status", "error", "prefilter"]
    lead = [c for c in dict.fromkeys(lead) if c in df.columns]
    df = df[lead + [c for c in df.columns if c not in lead]]
    return df.sort_values("point_index", kind="stable").reset_index(drop=True)


def is_missing(value: Any) -> bool:
    """True for None and NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))

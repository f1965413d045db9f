"""Progress for long commands (many simulations, sweeps, calibration), on stderr.

Nothing is shown for work that ends within :data:`DELAY_S`. After that, a terminal gets a rich
bar (transient: it disappears when done) and a log or a pipe gets a plain line every
:data:`EVERY_S` (``simulating iterations: 1 of 3 done, 12 s``), so a long run always shows signs
of life and ``--json`` output on stdout stays clean. ``enabled=False`` (a command's ``--quiet``)
turns it off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console

#: Seconds of work before any progress is shown.
DELAY_S = 2.0
#: Seconds between two plain progress lines when stderr is not a terminal.
EVERY_S = 10.0


class _State:
    """Steps done and the current description, shared with the drawing thread."""

    def __init__(self, total: int, description: str) -> None:
        self.total, self.done, self.description = total, 0, description
        self.t0 = time.monotonic()
        self.stop = threading.Event()

    def line(self) -> str:
        """One plain progress line."""
        return f"{self.description}: {self.done} of {self.total} done, {time.monotonic() - self.t0:.0f} s"


def _draw_bar(state: _State, console: Console, delay_s: float) -> None:
    """A rich bar from ``delay_s`` on, until ``state.stop``."""
    if state.stop.wait(delay_s):
        return
    # imported here: a bar is drawn only past DELAY_S on a terminal (rich.progress ~9 ms at start-up, issue 16)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(state.description, total=state.total, completed=state.done)
        while not state.stop.wait(0.1):
            bar.update(task, completed=state.done, description=state.description)


def _print_lines(state: _State, console: Console, delay_s: float, every_s: float) -> None:
    """A plain line at ``delay_s`` and every ``every_s`` after, until ``state.stop``."""
    if state.stop.wait(delay_s):
        return
    while True:
        console.print(state.line(), markup=False, highlight=False, soft_wrap=True)
        if state.stop.wait(every_s):
            return


@contextmanager
def progress_bar(
    total: int, description: str, *, enabled: bool = True, delay_s: float = DELAY_S, every_s: float = EVERY_S,
    console: Console | None = None,
) -> Iterator[Callable[..., None]]:
    """Yield ``advance(step=1, description=None)``; progress of ``total`` steps on stderr.

    Shown only once the block has run ``delay_s`` seconds: a bar on a terminal, else a plain
    line every ``every_s`` seconds.
    """
    if not enabled or total <= 0:
        yield lambda step=1, description=None: None
        return
    console = console or Console(stderr=True)
    state = _State(total, description)
    shown = console

    def draw() -> None:
        if shown.is_terminal:
            _draw_bar(state, shown, delay_s)
        else:
            _print_lines(state, shown, delay_s, every_s)

    drawer = threading.Thread(target=draw, name="offsim-progress", daemon=True)
    drawer.start()

    def advance(step: int = 1, description: str | None = None) -> None:
        state.done += step
        if description:
            state.description = description

    try:
        yield advance
    finally:
        state.stop.set()
        drawer.join()

"""A progress bar for long commands (many simulations, sweeps, calibration).

Drawn on stderr with rich, and only when stderr is a terminal, so ``--json`` output on stdout
and logs stay clean; ``enabled=False`` (a command's ``--quiet`` or ``--json``) turns it off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def progress_bar(total: int, description: str, *, enabled: bool = True) -> Iterator[Callable[..., None]]:
    """Yield ``advance(step=1, description=None)``; a bar of ``total`` steps while enabled.

    The bar is transient (it disappears when done) and never drawn when stderr is not a terminal.
    """
    console = Console(stderr=True)
    if not enabled or not console.is_terminal or total <= 0:
        yield lambda step=1, description=None: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)

        def advance(step: int = 1, description: str | None = None) -> None:
            bar.update(task, advance=step, **({"description": description} if description else {}))

        yield advance

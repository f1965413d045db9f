"""``offsim run``'s metrics table written without rich, where rich would write the same characters.

Importing rich (``rich.console`` and ``rich.table``) and rendering one table cost ``offsim run``
~25 ms of its start-up (issue 16: the whole process against the bare imports). When the table goes
to a file or a pipe (not a terminal: no colours, no styles) and fits the console's width, rich's
output is plain box drawing that :func:`two_column_table` writes directly; anywhere else (a
terminal, ``FORCE_COLOR``, a narrow console, text that markup or emoji codes would change) the
caller falls back to rich, so the output is the same in every case. The rules followed are rich
15's (``rich/console.py``: ``Console.is_terminal``, ``Console.size``, ``Console.encoding``;
``rich/table.py``: ``Table._render`` with ``show_header=False`` takes the box's plain-headed form,
``box.HEAVY_HEAD`` -> ``box.SQUARE``; ``rich/containers.py``: ``Lines.justify`` centres a title with
``(width - len) // 2`` spaces before it and the rest after). ``tests/test_plain_table.py``
compares the two on every shipped strategy and on widths around the table's own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

#: Characters printed as themselves by rich's markup and emoji rendering and one cell wide each:
#: printable ASCII less ``[`` (markup), ``\\`` (markup's escape) and ``:`` (``:emoji:`` codes).
PLAIN_CHARACTERS = frozenset(map(chr, range(32, 127))) - set("[\\:")
#: rich's width where neither ``COLUMNS`` nor a terminal gives one
DEFAULT_WIDTH = 80


def console_width(environ: Mapping[str, str]) -> int:
    """The width, in characters, of a rich ``Console()`` that is not writing to a terminal
    (``Console.__init__`` and ``Console.size``): ``COLUMNS`` when it is all digits, else the
    width of the first of stdin, stdout and stderr that is a terminal, else 80."""
    columns = environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns)
    for fd in (0, 1, 2):
        try:
            return os.get_terminal_size(fd).columns or DEFAULT_WIDTH
        except (AttributeError, ValueError, OSError):  # not a terminal
            continue
    return DEFAULT_WIDTH


def writes_plain(file: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether rich writes plain UTF-8 text to ``file``: not a terminal by any of rich's tests
    (``TTY_COMPATIBLE=1``, ``FORCE_COLOR``, ``isatty()``, IDLE, Jupyter), not a legacy Windows
    console, and a UTF encoding (else rich draws ASCII boxes). False when unsure: rich then writes."""
    if sys.platform == "win32" or "IPython" in sys.modules or "idlelib" in sys.modules:
        return False
    if environ.get("TTY_COMPATIBLE", "") == "1" or "FORCE_COLOR" in environ:
        return False
    try:
        if file.isatty():
            return False
    except ValueError:  # a closed file: rich takes it for not a terminal, and writing fails the same
        pass
    return (getattr(file, "encoding", "utf-8") or "utf-8").lower().startswith("utf")


def _plain(text: str) -> bool:
    return text == text.strip() and PLAIN_CHARACTERS.issuperset(text)


def two_column_table(title: str, rows: Sequence[tuple[str, str]], width: int) -> str | None:
    """The text of rich's ``Table(title=title, show_header=False)`` with a left-justified and a
    right-justified column, printed on a console ``width`` characters wide; None where rich would
    print anything else: a cell or the title not plain (:data:`PLAIN_CHARACTERS`, no surrounding
    spaces), an empty title, no rows, a table wider than ``width`` (rich wraps its cells) or a
    title wider than the table (rich wraps it)."""
    if not title or not rows or not all(_plain(text) for row in rows for text in row) or not _plain(title):
        return None
    left_w = max(len(label) for label, _ in rows) + 2  # one space of padding either side
    right_w = max(len(value) for _, value in rows) + 2
    table_w = left_w + right_w + 3  # three vertical edges
    if table_w > width or len(title) > table_w:
        return None
    before = (table_w - len(title)) // 2
    lines = [" " * before + title + " " * (table_w - len(title) - before),
             f"┌{'─' * left_w}┬{'─' * right_w}┐"]
    lines += [f"│ {label.ljust(left_w - 2)} │ {value.rjust(right_w - 2)} │" for label, value in rows]
    lines.append(f"└{'─' * left_w}┴{'─' * right_w}┘")
    return "\n".join(lines) + "\n"

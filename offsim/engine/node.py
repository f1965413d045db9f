"""One op instance in the executor: the op, where it belongs, and who waits for it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from offsim.schedule.ops import Op


class Node:
    """An op instance.

    Attributes:
        op: the template op.
        info: what the executor worked out once for the op (its phase, stream, span name...).
        iteration / micro_batch: the block instance it belongs to (-1: none).
        phase: the span phase (a program's ops take the phase of the op that started them).
        pending: dependencies not finished yet.
        then: called with the node when ``pending`` reaches 0 (start it, or finish it).
        finished: it has run.
        waiters: what its end lets go on, in order: a node (one dependency fewer) or a callable.
        head_s: when its stream let it go (its stream predecessor finished), seconds.
        start_s: when it started, seconds (-inf: not started).
        position: an access's position in its cache's sequence (-1: not an access).
    """

    __slots__ = (
        "finished",
        "head_s",
        "info",
        "iteration",
        "micro_batch",
        "op",
        "pending",
        "phase",
        "position",
        "request",
        "start_s",
        "stream_pred",
        "then",
        "waiters",
    )

    def __init__(self, op: Op, iteration: int, micro_batch: int, phase: str, info: Any = None) -> None:
        self.op = op
        self.info = info
        self.iteration = iteration
        self.micro_batch = micro_batch
        self.phase = phase
        self.pending = 0
        self.then: Callable[[Node], None] | None = None
        self.finished = False
        self.waiters: list[Node | Callable[[], None]] = []
        self.head_s = 0.0
        self.start_s = -math.inf
        self.position = -1
        self.stream_pred: Node | None = None
        self.request: Any = None  # the out-of-order stream's slots, one of which it holds while it runs

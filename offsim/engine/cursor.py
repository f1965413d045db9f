"""The executor's program counter: the schedule's body walked op by op, in issue order.

The same order as :meth:`~offsim.schedule.ops.Schedule.instances`, with its position as data (a
stack of :class:`Frame` s) so that the steady-state shortcut (:mod:`offsim.engine.steady`) can
compare it between repetitions and move it on by whole repetitions of a :class:`Repeat`.
"""

from __future__ import annotations

from collections.abc import Callable

from offsim.engine.node import Node
from offsim.schedule.ops import Block, Op, Repeat


class Frame:
    """One level of the body being walked: a sequence of items, and the repetition it is in.

    Attributes:
        items: the blocks and repeats of this level.
        index: the next item to enter.
        repeat: the repeat whose period ``items`` is (None: the schedule's body).
        k: the repetition (the iteration or micro-batch number along the repeat's axis).
        iteration / micro_batch: what the blocks of this level belong to.
    """

    __slots__ = ("index", "items", "iteration", "k", "micro_batch", "repeat")

    def __init__(self, items: tuple[Block | Repeat, ...], repeat: Repeat | None, k: int, iteration: int,
                 micro_batch: int) -> None:
        self.items, self.index, self.repeat, self.k = items, 0, repeat, k
        self.iteration, self.micro_batch = iteration, micro_batch


class Cursor:
    """Iterates the ops of the block instances in issue order; ``iteration``, ``micro_batch`` and
    ``nodes`` (the nodes issued so far) describe the instance of the op last returned.
    ``crossed`` lists the frames that began a repetition since it was last emptied, in order."""

    def __init__(self, body: tuple[Block | Repeat, ...]) -> None:
        self.frames = [Frame(body, None, 0, 0, -1)]
        self.block: Block | None = None
        self.op_index = 0
        self.nodes: list[Node] = []
        self.iteration, self.micro_batch = 0, -1
        #: frames that began a repetition, and (block, op index, op instances) of the runs of
        #: layer stretches begun (:mod:`offsim.engine.layers`), in order
        self.crossed: list[Frame | tuple[Block, int, list[Node]]] = []
        self.on_enter: Callable[[Frame], None] | None = None  # called as a repeat is entered

    def __iter__(self) -> Cursor:
        return self

    def __next__(self) -> Op:
        block = self.block
        if block is None or self.op_index >= len(block.ops):
            block = self.next_block()
        op = block.ops[self.op_index]
        self.op_index += 1
        return op

    def next_block(self) -> Block:
        """Enter the next block instance that has ops (StopIteration at the body's end)."""
        frames = self.frames
        while frames:
            f = frames[-1]
            if f.index < len(f.items):
                item = f.items[f.index]
                if isinstance(item, Block):
                    f.index += 1
                    if item.ops:
                        self.block, self.op_index, self.nodes = item, 0, []
                        self.iteration, self.micro_batch = f.iteration, f.micro_batch
                        return item
                elif item.times <= 0:
                    f.index += 1
                else:
                    it, mb = (item.first, f.micro_batch) if item.axis == "iteration" else (f.iteration, item.first)
                    frames.append(Frame(item.period, item, item.first, it, mb))
                    self.crossed.append(frames[-1])
                    if self.on_enter is not None:
                        self.on_enter(frames[-1])
                continue
            rep = f.repeat
            if rep is not None and f.k + 1 < rep.first + rep.times:
                f.k += 1
                f.index = 0
                if rep.axis == "iteration":
                    f.iteration = f.k
                else:
                    f.micro_batch = f.k
                self.crossed.append(f)
                continue
            frames.pop()
            if frames:
                frames[-1].index += 1
        self.block = None
        raise StopIteration

    def last_repetition(self, frame: Frame) -> int:
        """The last repetition of ``frame``'s repeat."""
        assert frame.repeat is not None
        return frame.repeat.first + frame.repeat.times - 1

    def move(self, frame: Frame, times: int) -> None:
        """Move on ``times`` repetitions of ``frame`` (the instance in progress and the frames
        inside it move with it)."""
        axis = frame.repeat.axis if frame.repeat is not None else "iteration"
        inside = self.frames[self.frames.index(frame):]
        frame.k += times
        for f in inside:
            if axis == "iteration":
                f.iteration += times
            elif f.micro_batch >= 0:
                f.micro_batch += times
        if axis == "iteration":
            self.iteration += times
        elif self.micro_batch >= 0:
            self.micro_batch += times

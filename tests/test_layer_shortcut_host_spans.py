"""A kernel (``Delay``) on a CPU stream is the host thread's time, recorded as a ``host`` span,
not a GPU one (:data:`offsim.engine.execute.HOST`).

Hand-built, after :mod:`offsim.mechanisms.host_dispatch`: the host thread issues a layer for
0.5 s, then the GPU runs its 1.0 s kernel. By hand: the host span [0, 0.5], the GPU span
[0.5, 1.5], the run ends at 1.5 s, and the GPU was busy 1.0 s of it (the host's 0.5 s was counted
as GPU work before: 1.5 s).
"""

from __future__ import annotations

from offsim.core.enums import Activity, MechanismId, Phase, StreamKind
from offsim.engine.execute import HOST, Executor, Machine
from offsim.schedule.ops import Block, Delay, Op, Repeat, Schedule, StreamSpec, Tag
from offsim.trace import Recorder


def _run() -> Recorder:
    host = Tag(Activity.HOST_SETUP, MechanismId.COMPUTE, Phase.FORWARD, layer=0, label="host issue")
    gpu = Tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD, layer=0)
    ops = (Op(0, Delay(0.5), host, stream="host_dispatch"), Op(1, Delay(1.0), gpu, stream="gpu", after=(0,)))
    schedule = Schedule((Repeat("iteration", 1, (Block("forward", ops),)),),
                        streams=(StreamSpec("gpu", StreamKind.GPU_COMPUTE, records_stalls=True),
                                 StreamSpec("host_dispatch", StreamKind.CPU)),
                        unit_names=("L0",))
    memory = {"gpu": 1e9, "host_pinned": 1e9, "host": 1e9, "nvme": 1e9, "pfs": 1e9}
    rec = Recorder()
    Executor(schedule, Machine({}, 1.0, 1, memory), {}, rec).run()
    return rec


def test_a_kernel_on_a_cpu_stream_is_a_host_span() -> None:
    rec = _run()
    assert [(s.resource, s.name, s.start_s, s.end_s) for s in rec.spans] == [
        (HOST, "L0 host issue", 0.0, 0.5), ("gpu", "L0 forward", 0.5, 1.5)]
    assert rec.end_s == 1.5
    assert sum(s.end_s - s.start_s for s in rec.spans if s.resource == "gpu") == 1.0

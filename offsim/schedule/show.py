"""A schedule for people (templates with their repeat counts, one op per line) and for programs
(``--json``: every op instance with ``id``, ``kind``, ``layer``, ``micro_batch``, resources,
``bytes`` or ``flops`` and ``after``, the instance ids it waits for)."""

from __future__ import annotations

from typing import Any

from offsim.schedule.analysis import OpInstance, default_programs, instance_counts, op_instances, traffic_bytes
from offsim.schedule.ops import (
    Access,
    Acquire,
    Alloc,
    Block,
    Choose,
    Delay,
    Done,
    Flow,
    Flush,
    Free,
    Op,
    Prefetch,
    Ready,
    Release,
    Schedule,
)


def describe_body(op: Op) -> str:
    """The op's body in a few words, with its bytes or seconds."""
    b = op.body
    if isinstance(b, Delay):
        return f"{b.seconds * 1e3:.4g} ms" + (f", {b.flops:.4g} FLOP" if b.flops else "")
    if isinstance(b, Flow):
        return f"{b.nbytes:,} B over {'+'.join(str(r) for r, _ in b.usage)}"
    if isinstance(b, Alloc):
        return f"hold {b.nbytes:,} B of {b.tier} for {b.tensor}"
    if isinstance(b, Free):
        return f"free {b.tensor} on {b.tier}"
    if isinstance(b, Acquire | Release):
        return f"{b.amount:,} of pool {b.pool}"
    if isinstance(b, Access | Ready | Done):
        return f"{b.cache} unit {b.unit}"
    if isinstance(b, Prefetch):
        return f"{b.cache} units {list(b.units)} keeping {b.reserve_bytes:,} B free"
    if isinstance(b, Flush):
        return f"{b.cache}"
    if isinstance(b, Choose):
        return f"{b.choice} (variant {b.variant}): its policy picks the program at run time"
    return ""


def _op_line(op: Op) -> str:
    deps = f" after {list(op.after)}" if op.after else ""
    reads = f" reads {','.join(map(str, op.reads))}" if op.reads else ""
    writes = f" writes {','.join(map(str, op.writes))}" if op.writes else ""
    label = f" ({op.tag.label})" if op.tag.label else ""
    layer = f" L{op.tag.layer}" if op.tag.layer >= 0 else f" g{op.tag.group}" if op.tag.group >= 0 else ""
    return (f"  {op.id:4d} {op.body.kind:<8} {op.tag.activity:<18} {op.stream or '-':<16}{layer} "
            f"{describe_body(op)}{label}{deps}{reads}{writes}")


def _block_text(block: Block, times: int | None = None) -> list[str]:
    head = f"{block.name}" + (f"  x{times}" if times is not None else "")
    return [head, *(_op_line(op) for op in block.ops)]


def to_text(schedule: Schedule) -> str:
    """Templates with repeat counts, then the cache programs, traffic and notes."""
    counts = instance_counts(schedule)
    lines: list[str] = ["streams: " + ", ".join(f"{s.name} ({s.kind})" for s in schedule.streams),
                        "pools: " + (", ".join(f"{p.name}={p.capacity:,}" for p in schedule.pools) or "none"), ""]
    for block in schedule.blocks():
        lines += [*_block_text(block, counts[block.name]), ""]
    for cache in schedule.caches:
        cap = "unbounded" if cache.capacity_bytes is None else f"{cache.capacity_bytes:,} B"
        lines.append(f"cache {cache.id} on {cache.tier}, capacity {cap}, {len(cache.unit_bytes)} units"
                     f"{', persistent' if cache.persistent else ''}; per unit (a miss runs):")
        unit = min(cache.fetch)
        lines += [*_block_text(cache.fetch[unit]), ""]
    for choice in schedule.choices:
        lines.append(f"choice {choice.id}: decided at run time by its policy; the program of the default option "
                     f"{choice.default!r} is:")
        for program in default_programs(schedule)[:1]:
            lines += _block_text(program)
        lines.append("")
    iterations = sorted({i.iteration for i in schedule.instances()})
    if iterations:
        last = iterations[-1]
        traffic = traffic_bytes(schedule, last)
        lines.append(f"traffic of iteration {last} with every cache access a miss: "
                     + (", ".join(f"{k}={v:,} B" for k, v in sorted(traffic.items())) or "none"))
    lines += [f"note: {n}" for n in schedule.notes]
    return "\n".join(lines)


def _instance_json(inst: OpInstance) -> dict[str, Any]:
    op = inst.op
    out: dict[str, Any] = {
        "id": inst.id, "kind": str(op.body.kind), "activity": str(op.tag.activity),
        "mechanism": str(op.tag.mechanism), "phase": str(op.tag.phase), "layer": op.tag.layer,
        "group": op.tag.group, "iteration": inst.iteration, "micro_batch": inst.micro_batch,
        "block": inst.block, "stream": op.stream, "after": list(inst.after),
    }
    b = op.body
    if isinstance(b, Flow):
        out |= {"bytes": b.nbytes, "resources": [str(r) for r, _ in b.usage], "links": [str(x) for x in b.links]}
    elif isinstance(b, Delay):
        out |= {"seconds": b.seconds, "flops": b.flops, "resources": ["gpu"]}
    elif isinstance(b, Alloc):
        out |= {"bytes": b.nbytes, "tier": str(b.tier), "tensor": str(b.tensor)}
    elif isinstance(b, Free):
        out |= {"tier": str(b.tier), "tensor": str(b.tensor)}
    elif isinstance(b, Acquire | Release):
        out |= {"pool": b.pool, "amount": b.amount}
    elif isinstance(b, Access | Ready | Done | Prefetch | Flush):
        out |= {"cache": str(b.cache)} | ({"unit": b.unit} if hasattr(b, "unit") else {})
    elif isinstance(b, Choose):
        out |= {"choice": str(b.choice), "variant": repr(b.variant)}
    if op.tag.label:
        out["label"] = op.tag.label
    return out


def to_json(schedule: Schedule) -> dict[str, Any]:
    """Every op instance, and the streams, pools and caches they name."""
    return {
        "streams": [{"name": s.name, "kind": str(s.kind), "records_stalls": s.records_stalls}
                    for s in schedule.streams],
        "pools": [{"name": p.name, "capacity": p.capacity} for p in schedule.pools],
        "caches": [{"id": str(c.id), "tier": str(c.tier), "capacity_bytes": c.capacity_bytes,
                    "unit_bytes": {str(k): v for k, v in c.unit_bytes.items()}, "persistent": c.persistent,
                    "fetch": {str(k): [_op_line(op).strip() for op in p.ops] for k, p in c.fetch.items()}}
                   for c in schedule.caches],
        "ops": [_instance_json(i) for i in op_instances(schedule)],
        "choices": [{"id": str(c.id), "default": repr(c.default),
                     "default_program": [_op_line(op).strip() for p in default_programs(schedule)[:1] for op in p.ops]}
                    for c in schedule.choices],
        "notes": list(schedule.notes),
    }

"""The engine: runs training iterations on a SimPy clock. SimPy lives here and nowhere else.

One iteration (one optimizer step):

1. for each micro-batch: forward per layer (fetch parameters within the prefetch window,
   compute, keep / offload / checkpoint activations), then backward per layer in reverse
   (re-fetch parameters, bring back or recompute activations, compute, reduce and offload
   gradients);
2. the optimizer step: on the GPU, or on the CPU per sub-group (read state from NVMe when it
   lives there, CPU Adam, write it back, send updated 16-bit parameters to their home),
   optionally overlapped with the next iteration (delayed parameter update); beside the CPU's
   sub-groups the GPU may update a resident share of the state (Twin-Flow) and sub-groups
   streamed from the host by a per-iteration performance model (Deep Optimizer States).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace

import simpy

from offsim.config.run import RunConfig
from offsim.engine.fetcher import ParamFetcher, build_ops
from offsim.engine.flows import Flow, FlowNetwork
from offsim.engine.ledger import MemoryLedger
from offsim.engine.optimizer_cache import OptimizerCache
from offsim.engine.policy_hooks import PolicyHooks
from offsim.engine.transfers import Transfers, duplex_rule, resource_capacities
from offsim.plan.footprint import (
    StateSizes,
    capacities,
    deepspeed_host_init,
    deepspeed_zero3_offload,
    first_step_state_bytes,
    grad_buffer_bytes,
    home_param_bytes,
    layerwise_grad_buffers,
    overflow_check_bytes,
    params_streamed,
    pfs_share,
    round_pinned,
)
from offsim.plan.model import Layer
from offsim.plan.optimizer_split import SplitBytes, SplitPlan, SplitRates, interleave, plan_split
from offsim.trace import Recorder, Span


@dataclass
class _Cursor:
    """Where the main process is: for labelling spans."""

    iteration: int = 0
    phase: str = "forward"


def _home_rank_tier(home: str, pinned: bool) -> str:
    return {"gpu": "gpu", "nvme": "nvme"}.get(home, "host_pinned" if pinned else "host_pageable")


class Engine:
    """One rank's training on a shared-resource model of its node."""

    def __init__(self, cfg: RunConfig, sz: StateSizes, recorder: Recorder) -> None:
        self.cfg, self.sz, self.rec = cfg, sz, recorder
        self.st = cfg.strategy
        self.env = simpy.Environment()
        self.cur = _Cursor()
        self.on_iteration: Callable[[int, int], None] | None = None
        self.net = FlowNetwork(self.env, resource_capacities(cfg, sz),
                               duplex_rule(cfg.hardware.host_link.duplex_efficiency), self._on_flow_done)
        self.ledger = MemoryLedger(self.env, recorder, capacities(cfg), sz.ranks_per_node,
                                   cfg.hardware.topology.nodes)
        self.io = Transfers(self.env, self.net, cfg, sz, self._nvme_write_rate())
        self.layers: list[Layer] = list(sz.layers)
        self.bpp_param = sz.param_bytes / sz.params_total
        self.bpp_grad = sz.grad_bytes / sz.params_total
        self.ckpt = cfg.activation_checkpointing
        self.tp = cfg.workload.training.tensor_parallel
        self.hidden_bytes = 2.0 * cfg.workload.training.tokens_per_micro_batch * cfg.workload.model.hidden
        self.streamed = params_streamed(cfg)
        self.grad_buffer_bytes = grad_buffer_bytes(cfg, sz)
        self.layerwise = self.st.optimizer_schedule == "layerwise"
        self.layer_updates: list[simpy.Process] = []
        buf = self.st.pinned_buffer_count * self.st.pinned_buffer_bytes  # usable bytes; the allocator may pin more
        self.staging = simpy.Container(self.env, capacity=buf, init=buf)
        self.pending: list[simpy.Event] = []
        # CUDA streams and aio queues: work on one stream runs in issue order, different
        # streams run concurrently and share bandwidth (DeepSpeed prefetches on one side stream)
        self.streams: dict[str, simpy.Resource] = {}
        # gradient buffers on the GPU waiting for their copy to the host (double buffering, as
        # DeepSpeed's reduce buckets): backward stalls when both are still in flight
        self.grad_slots = simpy.Resource(self.env, capacity=2)
        # layer-wise schedule consuming gradients as they arrive: host gradient buffers, each
        # held from the layer's copy to the end of its CPU update (None: a whole-model buffer)
        buffers = layerwise_grad_buffers(cfg)
        self.host_grad_slots = None if buffers is None else simpy.Resource(self.env, capacity=buffers)
        self.act_offload: dict[int, simpy.Process] = {}
        self.act_fetch: dict[int, simpy.Process] = {}  # activations on their way back to the GPU
        self.act_leaving: list[simpy.Event] = []  # offloads whose bytes still occupy the GPU
        self.prev_step: simpy.Process | None = None
        self.fetcher: ParamFetcher | None = None
        self.hooks = PolicyHooks(cfg, sz, recorder)
        self.opt_cache = None
        # Twin-Flow: the host keeps and updates 1 - f of the optimizer state, the GPU the rest
        self.host_share = 1.0 - self.st.optimizer_gpu_fraction
        self.layer_host_share = self._layer_host_shares()
        if self.hooks.dram_bytes > 0:
            self.opt_cache = OptimizerCache(self.hooks, self.io, self.ledger, self._subgroups())
        # Deep Optimizer States: rates observed in the last step, and each step's split decision
        self.split_rates: SplitRates | None = None
        self.split_plans: list[SplitPlan] = []

    # ---------------------------------------------------------------- helpers
    def _nvme_write_rate(self) -> float:
        nv = self.cfg.hardware.nvme
        if nv is None:
            return 1.0
        return nv.sustained_write_bytes_per_s(self._nvme_bytes_written_per_iteration() * self.sz.ranks_per_node)

    def _layer_host_shares(self) -> list[float]:
        """Per layer, the share of its optimizer state that the CPU updates: ``1 - f`` for every
        layer after backward (Twin-Flow); under the layer-wise schedule the GPU holds whole
        layers from the first on, f of the parameters in all (ProTrain's persistent chunks)."""
        f = self.st.optimizer_gpu_fraction
        if not self.layerwise or f == 0.0:
            return [self.host_share] * len(self.layers)
        gpu_left, shares = f * self.sz.params_total, []
        for lay in self.layers:
            on_gpu = min(max(gpu_left, 0.0), lay.params)
            gpu_left -= lay.params
            share = 1.0 - on_gpu / lay.params
            shares.append(0.0 if share < 1e-9 else share)
        return shares

    def _nvme_bytes_written_per_iteration(self) -> float:
        """Bytes one rank writes to NVMe per iteration (for the drives' cache model)."""
        sz, pl = self.sz, self.cfg.strategy.placement
        local = sz.local_params
        total = 0.0
        if pl.optimizer_states == "nvme":
            total += local * sz.optimizer_bytes_per_param
        if pl.grads == "nvme":
            total += sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param
        if pl.params == "nvme":
            total += sz.param_bytes / sz.param_part
        return total

    def _on_stream(self, stream: str, work: Generator) -> Generator:
        """Run ``work`` on a named in-order stream."""
        if stream not in self.streams:
            self.streams[stream] = simpy.Resource(self.env, capacity=1)
        with self.streams[stream].request() as req:
            yield req
            yield from work

    def _on_flow_done(self, flow: Flow) -> None:
        m = flow.meta
        for resource in (m["resource"], *m.get("also_on", ())):  # a GDS flow is NVMe and PCIe traffic
            self.rec.span(Span(m["iteration"], m["phase"], resource, m["kind"], flow.name,
                               m.get("layer", -1), flow.start_s, self.env.now, flow.size_bytes))

    def _meta(self, kind: str, name: str, layer: int = -1) -> dict:
        return {"iteration": self.cur.iteration, "phase": self.cur.phase, "kind": kind, "name": name,
                "layer": layer}

    def _compute(self, seconds: float, kind: str, layer: Layer) -> Generator:
        start = self.env.now
        yield self.env.timeout(seconds)
        self.rec.span(Span(self.cur.iteration, self.cur.phase, "gpu", kind, f"{layer.name} {kind}",
                           layer.index, start, self.env.now))

    def _wait(self, event: simpy.Event, layer: Layer, what: str) -> Generator:
        start = self.env.now
        yield event
        if self.env.now > start:
            self.rec.span(Span(self.cur.iteration, self.cur.phase, "gpu_stall", "stall",
                               f"{layer.name} waits for {what}", layer.index, start, self.env.now))

    # ---------------------------------------------------------------- parameters
    def _fetch_params(self, index: int, meta: dict) -> Generator:
        layer = self.layers[index]
        full = layer.params * self.bpp_param
        part = full / self.sz.param_part
        self.ledger.alloc("gpu", full, f"{layer.name} gathered params")
        home = self.st.placement.params
        if self.layerwise:  # the GPU-updated share's 16-bit params stay on the GPU
            part *= self.layer_host_share[index]
            home = home if part > 0 else "gpu"
        if home == "nvme":
            take = min(part, self.staging.capacity)
            yield self.staging.get(take)
            yield from self._on_stream("param_nvme", self.io.nvme_read(part, **meta))
            yield from self._on_stream("param_h2d", self.io.h2d(part, **meta))
            yield self.staging.put(take)
        elif home == "cpu":
            yield from self._on_stream("param_h2d", self.io.h2d(part, pinned=self.st.pin_memory, **meta))
        if self.sz.param_part > 1:
            gather = self.io.collective(full, 1.0, **{**meta, "kind": "param_allgather"})
            yield from self._on_stream("param_gather", gather)

    def _start_fetch(self, index: int) -> simpy.Process:
        meta = self._meta("param_fetch", f"{self.layers[index].name} params", index)
        return self.env.process(self._fetch_params(index, meta))

    def _release_params(self, index: int) -> None:
        self.ledger.free("gpu", self.layers[index].params * self.bpp_param)

    # ---------------------------------------------------------------- activations
    def _recomputes(self, layer: Layer) -> bool:
        d = self.hooks.activation(layer.index)
        return (self.ckpt and layer.is_block) if d is None else d.recompute

    def _act_tier(self, layer: Layer) -> str:
        d = self.hooks.activation(layer.index)
        return self.st.placement.activations if d is None else d.tier

    def _kept_bytes(self, layer: Layer) -> float:
        return layer.kept_bytes(self._recomputes(layer))

    def _offloads_activation(self, layer: Layer) -> bool:
        """Offload unless backward needs it within the prefetch window (the last layers)."""
        d = self.hooks.activation(layer.index)
        if d is not None:
            return d.tier != "gpu"
        if self.st.placement.activations == "gpu":
            return False
        return len(self.layers) - 1 - layer.index > self.st.prefetch_depth

    def _offload_activation(self, layer: Layer, meta: dict, off_gpu: simpy.Event) -> Generator:
        """GPU -> host (-> NVMe). Activations bound for NVMe pass through the pinned staging
        buffers (taken for the copy and the write), so host memory stays within that pool, or
        go straight to the array with GPUDirect Storage.
        ``off_gpu`` fires when the bytes have left the GPU."""
        nbytes = self._kept_bytes(layer)
        if self._act_tier(layer) == "nvme" and self.st.gpudirect_storage:
            yield from self._on_stream("act_nvme", self.io.gds("write", nbytes, **meta))
            self.ledger.free("gpu", nbytes)
            off_gpu.succeed()
            self.ledger.alloc("nvme", nbytes, f"{layer.name} activations on nvme")
            return
        if self._act_tier(layer) == "nvme":
            take = min(nbytes, self.staging.capacity)
            yield self.staging.get(take)
            yield from self._on_stream("act_d2h", self.io.d2h(nbytes, **meta))
            self.ledger.free("gpu", nbytes)
            off_gpu.succeed()
            self.ledger.alloc("nvme", nbytes, f"{layer.name} activations on nvme")
            yield from self._on_stream("act_nvme", self.io.nvme_write(nbytes, **meta))
            yield self.staging.put(take)
            return
        host = "host_pinned" if self.st.pin_memory else "host_pageable"
        self.ledger.alloc(host, nbytes, f"{layer.name} offloaded activations")
        yield from self._on_stream("act_d2h", self.io.d2h(nbytes, pinned=self.st.pin_memory, **meta))
        self.ledger.free("gpu", nbytes)
        off_gpu.succeed()

    def _throttle_offloads(self, layer: Layer) -> Generator:
        """Forward waits while more than ``prefetch_depth + 1`` offloaded activations still
        occupy the GPU: swap buffers are a bounded pool (the footprint counts ``depth + 2``
        blocks in flight), so a copy slower than the compute holds the forward back."""
        self.act_leaving = [e for e in self.act_leaving if not e.triggered]
        while len(self.act_leaving) > self.st.prefetch_depth + 1:
            yield from self._wait(self.act_leaving.pop(0), layer, "activation offload")

    def _fetch_activation(self, layer: Layer, meta: dict) -> Generator:
        yield self.act_offload.pop(layer.index)
        nbytes = self._kept_bytes(layer)
        self.ledger.alloc("gpu", nbytes, f"{layer.name} activations back")
        if self._act_tier(layer) == "nvme" and self.st.gpudirect_storage:
            yield from self._on_stream("act_nvme", self.io.gds("read", nbytes, **meta))
            self.ledger.free("nvme", nbytes)
            return
        if self._act_tier(layer) == "nvme":
            take = min(nbytes, self.staging.capacity)
            yield self.staging.get(take)
            yield from self._on_stream("act_nvme", self.io.nvme_read(nbytes, **meta))
            self.ledger.free("nvme", nbytes)
            yield from self._on_stream("act_h2d", self.io.h2d(nbytes, **meta))
            yield self.staging.put(take)
            return
        host = "host_pinned" if self.st.pin_memory else "host_pageable"
        yield from self._on_stream("act_h2d", self.io.h2d(nbytes, pinned=self.st.pin_memory, **meta))
        self.ledger.free(host, nbytes)

    # ---------------------------------------------------------------- forward / backward
    def _params_ready(self, op_index: int) -> simpy.Event | None:
        if not self.streamed or self.fetcher is None:
            return None
        self.fetcher.advance(op_index)
        return self.fetcher.ready(op_index)

    def _forward_layer(self, op_index: int, layer: Layer) -> Generator:
        ready = self._params_ready(op_index)
        if ready is not None:
            yield from self._wait(ready, layer, "params")
        kept = self._kept_bytes(layer)
        transient = layer.act_full_bytes if kept < layer.act_full_bytes else 0.0
        self.ledger.alloc("gpu", kept + transient, f"{layer.name} activations")
        yield from self._compute(layer.fwd_s, "forward", layer)
        yield from self._tp_allreduce(layer, "forward")
        self.ledger.free("gpu", transient)
        if self._offloads_activation(layer):
            meta = self._meta("act_offload", f"{layer.name} activations", layer.index)
            off_gpu = self.env.event()
            self.act_offload[layer.index] = self.env.process(self._offload_activation(layer, meta, off_gpu))
            self.act_leaving.append(off_gpu)
            yield from self._throttle_offloads(layer)
        if self.fetcher is not None and self.streamed:
            self.fetcher.after(op_index)

    def _tp_allreduce(self, layer: Layer, what: str) -> Generator:
        """Tensor parallelism: a block's two all-reduces of its 16-bit ``sbh`` output (after the
        attention and the MLP) in forward and recompute, two of the input gradients in backward
        (Megatron-LM, arXiv 1909.08053 Fig. 3: f and g operators); the GPU waits for them."""
        if self.tp == 1 or not layer.is_block:
            return
        meta = self._meta("tp_allreduce", f"{layer.name} {what} all-reduce", layer.index)
        start = self.env.now
        yield from self.io.tensor_parallel_allreduce(self.hidden_bytes, 2, **meta)
        self.rec.span(Span(self.cur.iteration, self.cur.phase, "gpu_stall", "stall",
                           f"{layer.name} waits for tensor-parallel all-reduce", layer.index, start, self.env.now))

    def _start_activation_fetch(self, layer: Layer) -> simpy.Process:
        meta = self._meta("act_fetch", f"{layer.name} activations", layer.index)
        proc = self.env.process(self._fetch_activation(layer, meta))
        self.act_fetch[layer.index] = proc
        return proc

    def _prefetch_activations(self, layer: Layer, upcoming: Sequence[Layer]) -> None:
        """Start bringing back the offloaded activations of the next layers of the backward
        (up to ``prefetch_depth`` of them) while GPU memory allows, keeping room for this
        layer's backward: ZeRO-Infinity, TBA / SSDTrain and Fuyou all read activations ahead
        of their use, and Fuyou's prefetcher fills only the GPU memory that is free."""
        reserve = layer.backward_work_bytes(self._recomputes(layer)) + self.grad_buffer_bytes
        for nxt in upcoming:
            if nxt.index not in self.act_offload or nxt.index in self.act_fetch:
                continue
            free = self.ledger.capacity["gpu"] - self.ledger.rank_bytes["gpu"]
            if self._kept_bytes(nxt) + reserve > free:
                return
            self._start_activation_fetch(nxt)

    def _backward_layer(self, op_index: int, layer: Layer, mb: int, upcoming: Sequence[Layer] = ()) -> Generator:
        ready = self._params_ready(op_index)
        act = self.act_fetch.pop(layer.index, None)
        if act is None and layer.index in self.act_offload:
            act = self._start_activation_fetch(layer)
            self.act_fetch.pop(layer.index)
        self._prefetch_activations(layer, upcoming)
        if act is not None:
            yield from self._wait(act, layer, "activations")
        if ready is not None:
            yield from self._wait(ready, layer, "params")
        kept = self._kept_bytes(layer)
        recompute = self._recomputes(layer)
        work = layer.backward_work_bytes(recompute)
        self.ledger.alloc("gpu", work, f"{layer.name} backward working memory")
        if recompute:
            yield from self._compute(layer.fwd_s, "recompute", layer)
            yield from self._tp_allreduce(layer, "recompute")
        yield from self._compute(layer.bwd_s, "backward", layer)
        yield from self._tp_allreduce(layer, "backward")
        self.ledger.free("gpu", work + kept)
        yield from self._gradients(layer, mb)
        if self.fetcher is not None and self.streamed:
            self.fetcher.after(op_index)

    def _gradients(self, layer: Layer, mb: int) -> Generator:
        """Reduce the layer's gradients and send them home; blocks unless overlapped."""
        if self.st.placement.grads == "gpu":
            if self.sz.dp > 1:
                factor = 1.0 if self.st.zero_stage >= 2 else 2.0
                meta = self._meta("grad_reduce", f"{layer.name} grads", layer.index)
                self.pending.append(self.env.process(self.io.collective(layer.params * self.bpp_grad, factor, **meta)))
            return
        if self.st.grad_compression_ratio > 1.0:  # projected on the compute stream, before the copy
            yield from self._compute(self._compress_s(layer), "grad_compress", layer)
        host_slot = None
        if self.host_grad_slots is not None and self.layer_host_share[layer.index] > 0:
            host_slot = self.host_grad_slots.request()
            yield from self._wait(host_slot, layer, "a free host gradient buffer")
        slot = self.grad_slots.request()
        yield from self._wait(slot, layer, "a free gradient buffer")
        meta = self._meta("grad_offload", f"{layer.name} grads", layer.index)
        proc = self.env.process(self._offload_grads(layer, mb, slot, meta, host_slot))
        if self.st.overlap_grad_offload:
            self.pending.append(proc)
        else:
            yield from self._wait(proc, layer, "gradient offload")
        on_gpu = 1.0 - self.layer_host_share[layer.index]
        if self.layerwise and on_gpu > 0 and mb == self.cfg.workload.training.grad_accumulation - 1:
            params = layer.params / self.sz.opt_part * on_gpu
            name = f"GPU Adam {layer.name} (GPU-resident share)"
            yield from self._gpu_adam(self.cur.iteration, params, name)

    def _offload_grads(self, layer: Layer, mb: int, slot: simpy.resources.resource.Request, meta: dict,
                       host_slot: simpy.resources.resource.Request | None = None) -> Generator:
        """Copy a layer's gradients home; ``host_slot`` is its host gradient buffer under a
        layer-wise schedule with bounded buffers (released when its update is done)."""
        full = layer.params * self.bpp_grad
        held = min(full, self.grad_buffer_bytes)
        self.ledger.alloc("gpu", held, f"{layer.name} gradient buffer")
        if self.sz.dp > 1:
            factor = 1.0 if self.st.zero_stage >= 2 else 2.0
            reduce = self.io.collective(full, factor, **{**meta, "kind": "grad_reduce"})
            yield from self._on_stream("grad_reduce", reduce)
        ratio = self.st.grad_compression_ratio
        share = self.layer_host_share[layer.index]
        part = full / self.sz.grad_part / ratio * share
        if part > 0:
            yield from self._on_stream("grad_d2h", self.io.d2h(part, pinned=self.st.pin_memory, **meta))
        self.ledger.free("gpu", held)
        self.grad_slots.release(slot)
        local_params = layer.params / self.sz.grad_part / ratio * share
        hg = self.sz.host_grad_bytes_per_param
        last = mb == self.cfg.workload.training.grad_accumulation - 1
        host = "host_pinned" if self.st.pin_memory else "host_pageable"
        if host_slot is not None:
            self.ledger.alloc(host, local_params * hg, f"{layer.name} host gradient buffer")
        if self.layerwise and local_params <= 0:  # all of it is updated on the GPU
            return
        if self.layerwise and last:  # the gradient stays in DRAM for the update that follows
            acc = {**meta, "kind": "grad_accumulate", "name": f"{layer.name} grads accumulate"}
            yield from self._on_stream("grad_host", self.io.host_copy(local_params * (self.bpp_grad + hg), **acc))
            update = self._on_stream("cpu_update", self._update_layer(layer, meta["iteration"]))
            if host_slot is not None:
                update = self._then_release(update, host_slot, host, local_params * hg)
            self.layer_updates.append(self.env.process(update))
        elif self.st.placement.grads == "nvme":
            cast = {**meta, "kind": "grad_cast", "name": f"{layer.name} grads to fp32"}
            yield from self._on_stream("grad_host", self.io.host_copy(local_params * (self.bpp_grad + hg), **cast))
            if mb > 0:
                yield from self._on_stream("grad_nvme", self.io.nvme_read(local_params * hg, **meta))
            yield from self._on_stream("grad_nvme", self.io.nvme_write(local_params * hg, **meta))
        else:  # accumulate into the fp32 host gradient: read 16-bit, read-modify-write fp32
            acc = {**meta, "kind": "grad_accumulate", "name": f"{layer.name} grads accumulate"}
            dram = local_params * (self.bpp_grad + (2 if mb else 1) * hg)
            yield from self._on_stream("grad_host", self.io.host_copy(dram, **acc))

    def _then_release(self, work: Generator, slot: simpy.resources.resource.Request, tier: str,
                      nbytes: float) -> Generator:
        """Run ``work``, then free a host gradient buffer (its bytes and its slot)."""
        yield from work
        self.ledger.free(tier, nbytes)
        assert self.host_grad_slots is not None
        self.host_grad_slots.release(slot)

    def _compress_s(self, layer: Layer) -> float:
        """GPU seconds to project a layer's gradient before its copy (LSP-Offload)."""
        flop = layer.params * self.st.grad_compression_flop_per_param
        if flop <= 0:
            return 0.0
        gpu = self.cfg.hardware.gpu
        return flop / (gpu.peak_flops(self.cfg.workload.precision.compute) * gpu.gemm_fraction(flop))

    def _update_layer(self, layer: Layer, iteration: int) -> Generator:
        """Layer-wise CPU update as soon as the layer's last gradient is on the host (Fuyou's
        out-of-core optimizer overlapped with backward; LSP-Offload's layer-wise schedule):
        read the layer's optimizer state when it lives on NVMe, CPU Adam, write it back, send
        the updated 16-bit parameters home."""
        sz, pl = self.sz, self.st.placement
        share = self.layer_host_share[layer.index]  # the rest is updated on the GPU
        params = layer.params / sz.opt_part / self.st.grad_compression_ratio * share
        meta = {"iteration": iteration, "phase": "backward", "layer": layer.index}
        state = params * sz.optimizer_bytes_per_param
        if pl.optimizer_states == "nvme":
            self.ledger.alloc("host_pinned", state, f"{layer.name} optimizer state in")
            yield from self.io.nvme_read(state, kind="optimizer_swap_in", name=f"{layer.name} state in", **meta)
        yield from self.io.cpu_optimizer(params, self._optimizer_dram_bytes_per_param(), kind="optimizer",
                                         name=f"CPU Adam {layer.name}", **meta)
        if pl.optimizer_states == "nvme":
            yield from self.io.nvme_write(state, kind="optimizer_swap_out", name=f"{layer.name} state out", **meta)
            self.ledger.free("host_pinned", state)
        nbytes = params * self.bpp_param
        home = {"kind": "param_update", "name": f"{layer.name} params", **meta}
        if pl.params == "gpu":
            yield from self._on_stream("param_update_h2d", self.io.h2d(nbytes, pinned=self.st.pin_memory, **home))
        elif pl.params == "nvme":
            yield from self.io.nvme_write(nbytes, **home)

    # ---------------------------------------------------------------- optimizer
    def _optimizer_dram_bytes_per_param(self) -> float:
        """DRAM bytes per parameter of one step: read and write master + moments, read the
        gradient, write the 16-bit parameter."""
        sz = self.sz
        return 2 * sz.optimizer_bytes_per_param + sz.host_grad_bytes_per_param + self.bpp_param

    def _optimizer_step(self, iteration: int) -> Generator:
        pending, self.pending = self.pending, []
        yield simpy.AllOf(self.env, pending)
        if self.layerwise:  # the updates ran during backward: wait for the stragglers
            updates, self.layer_updates = self.layer_updates, []
            yield simpy.AllOf(self.env, updates)
        elif self.cfg.strategy.optimizer_device == "gpu":
            yield from self._gpu_step(iteration)
        else:
            yield from self._cpu_step(iteration)

    def _span_meta(self, iteration: int, kind: str, name: str) -> dict:
        return {"iteration": iteration, "phase": "optimizer", "kind": kind, "name": name, "layer": -1}

    def _gpu_step(self, iteration: int) -> Generator:
        sz = self.sz
        bpp = 2 * sz.optimizer_bytes_per_param + self.bpp_grad + self.bpp_param
        seconds = sz.local_params * bpp / self.cfg.hardware.gpu.hbm_bytes_per_s
        start = self.env.now
        yield self.env.timeout(seconds)
        self.rec.span(Span(iteration, "optimizer", "gpu", "optimizer", "GPU Adam", -1, start, self.env.now))
        if sz.dp > 1 and self.st.zero_stage in (1, 2):
            meta = self._span_meta(iteration, "param_allgather", "updated params all-gather")
            yield from self.io.collective(sz.param_bytes, 1.0, **meta)

    def _subgroups(self) -> list[float]:
        """Host-resident optimizer sub-groups (parameters each)."""
        local = self.sz.local_params * self.host_share
        n = max(1, math.ceil(local / self.st.sub_group_params))
        return [local / n] * n

    def _cpu_step(self, iteration: int) -> Generator:
        self._overflow_check()
        groups = self._subgroups()
        order = self.hooks.group_order(iteration, len(groups))
        on_gpu = self._plan_gpu_groups(iteration, groups, order)
        side = self._start_gpu_side(iteration, groups, order, on_gpu)
        order = [g for g in order if g not in on_gpu]
        cpu_start = self.env.now
        writes: list[simpy.Process] = []
        if order:
            yield from self._cpu_groups(iteration, groups, order, writes)
        self._observe_cpu(sum(groups[g] for g in order), self.env.now - cpu_start)
        yield simpy.AllOf(self.env, writes + side)

    def _cpu_groups(self, iteration: int, groups: list[float], order: list[int],
                    writes: list[simpy.Process]) -> Generator:
        """CPU Adam over ``order``'s sub-groups (read, update, write back, parameters home)."""
        pipeline = self.st.optimizer_swap_pipeline
        reading = self.env.process(self._read_group(iteration, order[0], groups[order[0]]))
        for k, g in enumerate(order):
            params = groups[g]
            waited_from = self.env.now
            yield reading
            self.hooks.optimizer_stall(iteration, self.env.now - waited_from)
            if pipeline and k + 1 < len(order):
                reading = self.env.process(self._read_group(iteration, order[k + 1], groups[order[k + 1]]))
            meta = self._span_meta(iteration, "optimizer", f"CPU Adam sub-group {g}")
            yield from self.io.cpu_optimizer(params, self._optimizer_dram_bytes_per_param(), **meta)
            write = self.env.process(self._write_group(iteration, g, params))
            if pipeline:
                writes.append(write)
            else:
                yield write
                if k + 1 < len(order):
                    reading = self.env.process(self._read_group(iteration, order[k + 1], groups[order[k + 1]]))

    def _group_state_bytes(self, params: float) -> tuple[float, float]:
        """(bytes read from NVMe, bytes staged in pinned memory) for one sub-group."""
        pl, sz = self.st.placement, self.sz
        read = 0.0
        if pl.optimizer_states == "nvme":
            read += params * sz.optimizer_bytes_per_param
        if pl.grads == "nvme":
            read += params * sz.host_grad_bytes_per_param
        return read, read

    def _read_group(self, iteration: int, g: int, params: float) -> Generator:
        nbytes, staged = self._group_state_bytes(params)
        if nbytes <= 0:
            return
        self._first_step_states(iteration, g, params, alloc=True)
        if self.opt_cache is not None:
            yield from self.opt_cache.read(iteration, g, params)
            return
        self.hooks.uncached_group(iteration, g, params)
        self.ledger.alloc("host_pinned", self._group_swap_buffer(staged), f"sub-group {g} swap buffer")
        meta = self._span_meta(iteration, "optimizer_swap_in", f"sub-group {g} state in")
        yield from self.io.nvme_read(nbytes, **meta)

    def _write_group(self, iteration: int, g: int, params: float) -> Generator:
        pl, sz = self.st.placement, self.sz
        nbytes, staged = self._group_state_bytes(params)
        if self.opt_cache is not None:
            yield from self.opt_cache.write(iteration, g, params)
            self._first_step_states(iteration, g, params, alloc=False)
            yield from self._params_home(iteration, g, params)
            return
        if pl.optimizer_states == "nvme":
            meta = self._span_meta(iteration, "optimizer_swap_out", f"sub-group {g} state out")
            yield from self.io.nvme_write(params * sz.optimizer_bytes_per_param, **meta)
        self.ledger.free("host_pinned", self._group_swap_buffer(staged))
        if nbytes > 0:
            self._first_step_states(iteration, g, params, alloc=False)
        yield from self._params_home(iteration, g, params)

    def _group_swap_buffer(self, staged: float) -> float:
        """Pinned bytes a sub-group's swap takes while in flight: its state rounded by the
        allocator; none on DeepSpeed's ZeRO-3 path, whose swap buffers are a pool allocated once
        at start-up (:func:`~offsim.plan.footprint.deepspeed_host_init`)."""
        if deepspeed_zero3_offload(self.cfg):
            return 0.0
        return round_pinned(staged, self.st.host_allocator)

    def _first_step_states(self, iteration: int, g: int, params: float, alloc: bool) -> None:
        """DeepSpeed's first step: CPU Adam creates the sub-group's moments as pageable tensors,
        released once swapped out (:func:`~offsim.plan.footprint.first_step_state_bytes`)."""
        nbytes = first_step_state_bytes(self.cfg, params) if iteration == 0 else 0.0
        if alloc:
            self.ledger.alloc("host_pageable", nbytes, f"sub-group {g} moments made by the first step")
        else:
            self.ledger.free("host_pageable", nbytes)

    def _overflow_check(self) -> None:
        """DeepSpeed's fp16 overflow check before the sub-group loop: its temporaries are
        allocated and freed at once (:func:`~offsim.plan.footprint.overflow_check_bytes`); its
        CPU time is not modelled."""
        nbytes = overflow_check_bytes(self.cfg, self.sz)
        self.ledger.alloc("host_pageable", nbytes, "overflow check temporaries (isinf, isnan)")
        self.ledger.free("host_pageable", nbytes)

    def _params_home(self, iteration: int, g: int, params: float) -> Generator:
        """Send the sub-group's updated 16-bit parameters to where they live."""
        home = self.st.placement.params
        nbytes = params * self.bpp_param
        meta = self._span_meta(iteration, "param_update", f"sub-group {g} params")
        if home == "gpu":
            yield from self.io.h2d(nbytes, pinned=self.st.pin_memory, **meta)
            if self.sz.dp > 1 and self.st.zero_stage in (1, 2):
                yield from self.io.collective(nbytes * self.sz.dp, 1.0, **{**meta, "kind": "param_allgather"})
        elif home == "nvme":
            yield from self.io.nvme_write(nbytes, **meta)

    # ---------------------------------------------------------------- optimizer on the GPU too
    # Twin-Flow keeps a fixed share f of the state on the GPU; Deep Optimizer States streams
    # some host-resident sub-groups to the GPU each step. Both run beside the CPU sub-group loop.
    def _gpu_resident_state_bytes(self) -> float:
        """GPU bytes of the Twin-Flow share: fp32 master params, moments and fp32 gradients."""
        sz, f = self.sz, self.st.optimizer_gpu_fraction
        grads = sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param
        return f * (sz.local_params * sz.optimizer_bytes_per_param + grads)

    def _gpu_adam_bytes_per_param(self) -> float:
        """HBM bytes per parameter of GPU Adam (as :meth:`_gpu_step`), fp32 gradient read."""
        sz = self.sz
        return 2 * sz.optimizer_bytes_per_param + sz.host_grad_bytes_per_param + self.bpp_param

    def _gpu_adam(self, iteration: int, params: float, name: str) -> Generator:
        """GPU Adam over ``params``: HBM-bound on the GPU's compute stream."""
        start = self.env.now
        hbm_bytes = params * self._gpu_adam_bytes_per_param()
        yield self.env.timeout(hbm_bytes / self.cfg.hardware.gpu.hbm_bytes_per_s)
        self.rec.span(Span(iteration, "optimizer", "gpu", "optimizer", name, -1, start, self.env.now))

    def _start_gpu_side(self, iteration: int, groups: list[float], order: list[int],
                        on_gpu: set[int]) -> list[simpy.Process]:
        """Start the GPU's part of the step: the resident share, then the streamed sub-groups."""
        side: list[simpy.Process] = []
        resident = self.sz.local_params * self.st.optimizer_gpu_fraction
        if resident > 0:
            side.append(self.env.process(self._resident_update(iteration, resident)))
        if on_gpu:
            buffers = simpy.Resource(self.env, capacity=self.split_plans[-1].buffers)
            side += [self.env.process(self._stream_group(iteration, g, groups[g], buffers))
                     for g in order if g in on_gpu]
        return side

    def _resident_update(self, iteration: int, params: float) -> Generator:
        """Twin-Flow: GPU Adam over the GPU-resident share; its 16-bit params are cast in place."""
        update = self._gpu_adam(iteration, params, "GPU Adam (GPU-resident share)")
        yield from self._on_stream("gpu_opt", update)
        if self.sz.dp > 1 and self.st.zero_stage in (1, 2):
            meta = self._span_meta(iteration, "param_allgather", "GPU-updated params all-gather")
            yield from self.io.collective(params * self.bpp_param * self.sz.dp, 1.0, **meta)

    def _stream_group(self, iteration: int, g: int, params: float, buffers: simpy.Resource) -> Generator:
        """Deep Optimizer States: one host sub-group updated on the GPU. Its fp32 state and
        gradient go H2D into a GPU buffer, GPU Adam updates them, the state goes back D2H (and the
        16-bit parameters too when they live on the host); H2D shares the link with the CPU
        path's parameter uploads."""
        sz, pinned = self.sz, self.st.pin_memory
        state = params * sz.optimizer_bytes_per_param
        buf = state + params * sz.host_grad_bytes_per_param
        with buffers.request() as req:
            yield req
            self.ledger.alloc("gpu", buf, f"sub-group {g} optimizer state on the GPU")
            meta = self._span_meta(iteration, "optimizer_h2d", f"sub-group {g} state to GPU")
            yield from self._on_stream("opt_h2d", self.io.h2d(buf, pinned=pinned, **meta))
            update = self._gpu_adam(iteration, params, f"GPU Adam sub-group {g}")
            yield from self._on_stream("gpu_opt", update)
            back = state + (params * self.bpp_param if self.st.placement.params != "gpu" else 0.0)
            meta = self._span_meta(iteration, "optimizer_d2h", f"sub-group {g} state to host")
            yield from self._on_stream("opt_d2h", self.io.d2h(back, pinned=pinned, **meta))
            self.ledger.free("gpu", buf)
        if self.sz.dp > 1 and self.st.zero_stage in (1, 2):
            meta = self._span_meta(iteration, "param_allgather", f"sub-group {g} params all-gather")
            yield from self.io.collective(params * self.bpp_param * self.sz.dp, 1.0, **meta)

    def _plan_gpu_groups(self, iteration: int, groups: list[float], order: list[int]) -> set[int]:
        """The sub-groups this step streams to the GPU (none unless ``optimizer_split`` is
        ``perf-model``), from :func:`~offsim.plan.optimizer_split.plan_split`."""
        if self.st.optimizer_split != "perf-model" or not groups:
            return set()
        pl = self.st.placement
        hg, opt = self.sz.host_grad_bytes_per_param, self.sz.optimizer_bytes_per_param
        b = SplitBytes(h2d_gpu=opt + hg, d2h_gpu=opt + (self.bpp_param if pl.params != "gpu" else 0.0),
                       hbm_gpu=self._gpu_adam_bytes_per_param(),
                       h2d_cpu=self.bpp_param if pl.params == "gpu" else 0.0, gpu_buffer=opt + hg)
        if self.split_rates is None:
            self.split_rates = self._profile_split_rates()
        free = self.ledger.capacity["gpu"] - self.ledger.rank_bytes["gpu"]
        plan = plan_split(len(groups), groups[0], self.split_rates, b, free,
                          3 if self.st.optimizer_swap_pipeline else 1)
        self.split_plans.append(plan)
        return interleave(order, plan.gpu_groups)

    def _profile_split_rates(self) -> SplitRates:
        """Rates for the first split decision: the profile's (CPU Adam also bound by DRAM)."""
        hw, n = self.cfg.hardware, self.sz.ranks_per_node
        dram_bound = hw.dram.bandwidth_bytes_per_s / self._optimizer_dram_bytes_per_param()
        cpu = min(hw.cpu.optimizer_params_per_s, dram_bound)
        link = hw.host_link
        kind = "pinned" if self.st.pin_memory else "pageable"
        return SplitRates(cpu_params_per_s=cpu / n,
                          h2d_bytes_per_s=getattr(link.h2d, kind).peak_bytes_per_s,
                          d2h_bytes_per_s=getattr(link.d2h, kind).peak_bytes_per_s,
                          hbm_bytes_per_s=hw.gpu.hbm_bytes_per_s, duplex_efficiency=link.duplex_efficiency)

    def _observe_cpu(self, params: float, seconds: float) -> None:
        """Carry the CPU's observed update rate (under the step's DRAM contention) into the next
        split decision. Link rates stay the profile's: the model itself shares the link between
        the two paths, and a single copy's observed rate would count that sharing twice."""
        if self.split_rates is not None and params > 0 and seconds > 0:
            self.split_rates = replace(self.split_rates, cpu_params_per_s=params / seconds)

    # ---------------------------------------------------------------- iterations
    def _allocate_static(self) -> None:
        sz, pl, st = self.sz, self.st.placement, self.st
        self.ledger.alloc("gpu", self.cfg.hardware.gpu.reserved_bytes, "reserved")
        pinned = st.pin_memory
        self.ledger.alloc(_home_rank_tier(pl.params, pinned), home_param_bytes(self.cfg, sz), "params")
        if pl.grads == "gpu":
            self.ledger.alloc("gpu", sz.grad_bytes / sz.grad_part, "grads")
        elif self.host_grad_slots is None:
            g = sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param * self.host_share
            self.ledger.alloc(_home_rank_tier(pl.grads, pinned), self._pinned_groups(g, pl.grads), "grads")
        o = sz.local_params * sz.optimizer_bytes_per_param * self.host_share
        self.ledger.alloc("gpu", self._gpu_resident_state_bytes(), "optimizer state, fp32 grads on the GPU")
        on_pfs = pfs_share(self.cfg)
        self.ledger.alloc(_home_rank_tier(pl.optimizer_states, pinned),
                          self._pinned_groups(o * (1.0 - on_pfs), pl.optimizer_states), "optimizer state")
        self.ledger.alloc("pfs", o * on_pfs, "optimizer state striped to the PFS")
        if deepspeed_zero3_offload(self.cfg):
            self._allocate_deepspeed_host()
        elif st.needs_staging_buffers():
            staging = self.st.pinned_buffer_count * round_pinned(self.st.pinned_buffer_bytes, self.st.host_allocator)
            self.ledger.alloc("host_pinned", staging, "pinned staging buffers")

    def _allocate_deepspeed_host(self) -> None:
        """Replay DeepSpeed ZeRO-3's host set-up in order: persistent swap buffers and gradient
        partitions, and the transient pageable copies and scratch on the way
        (:func:`~offsim.plan.footprint.deepspeed_host_init`)."""
        for s in deepspeed_host_init(self.cfg, self.sz):
            if s.nbytes > 0:
                self.ledger.alloc(s.tier, s.nbytes, s.what)
            else:
                self.ledger.free(s.tier, -s.nbytes)

    def _pinned_groups(self, nbytes: float, home: str) -> float:
        if home != "cpu" or not self.st.pin_memory or self.st.host_allocator != "caching":
            return nbytes
        n = len(self._subgroups())
        return n * round_pinned(nbytes / n, "caching")

    def _micro_batch(self, ops: list, mb: int) -> Generator:
        n = len(self.layers)
        base = mb * 2 * n
        self.cur.phase = "forward"
        start = self.env.now
        for k, layer in enumerate(self.layers):
            yield from self._forward_layer(base + k, layer)
        self.rec.phase(self.cur.iteration, "forward", start, self.env.now)
        self.cur.phase = "backward"
        start = self.env.now
        backward = list(reversed(self.layers))
        depth = self.st.prefetch_depth
        for k, layer in enumerate(backward):
            yield from self._backward_layer(base + n + k, layer, mb, backward[k + 1:k + 1 + depth])
        self.rec.phase(self.cur.iteration, "backward", start, self.env.now)

    def run(self) -> Generator:
        """The main process: all iterations, then wait for the last optimizer step."""
        self._allocate_static()
        ops = build_ops(len(self.layers), self.cfg.workload.training.grad_accumulation)
        for it in range(self.cfg.iterations):
            self.cur.iteration = it
            self.rec.iteration_starts_s.append(self.env.now)
            if self.streamed:
                self.fetcher = self.hooks.param_fetcher(self.env, ops, it, self._start_fetch,
                                                        self._release_params, self.ledger)
            for mb in range(self.cfg.workload.training.grad_accumulation):
                yield from self._micro_batch(ops, mb)
            if self.fetcher is not None:
                yield from self.fetcher.release_all()
            yield from self._step(it)
            if self.on_iteration is not None:
                self.on_iteration(it + 1, self.cfg.iterations)
        if self.prev_step is not None:
            yield self.prev_step
        self.rec.end_s = self.env.now

    def _step(self, it: int) -> Generator:
        start = self.env.now
        if self.st.delayed_param_update:
            if self.prev_step is not None:
                yield self.prev_step
            self.prev_step = self.env.process(self._optimizer_step(it))
        else:
            yield self.env.process(self._optimizer_step(it))
        self.rec.phase(it, "optimizer", start, self.env.now)


def run_engine(cfg: RunConfig, sz: StateSizes,
               on_iteration: Callable[[int, int], None] | None = None) -> tuple[Recorder, MemoryLedger, int]:
    """Simulate ``cfg``; returns the recorder, the ledger (peaks) and the SimPy events processed.

    ``on_iteration(done, total)`` is called as each iteration's main process finishes (progress).
    """
    rec = Recorder()
    engine = Engine(cfg, sz, rec)
    engine.on_iteration = on_iteration
    engine.env.process(engine.run())
    events = 0
    env = engine.env
    while True:
        try:
            env.step()
        except simpy.core.EmptySchedule:
            break
        events += 1
    return rec, engine.ledger, events

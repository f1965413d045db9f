"""DeepSpeed's memory estimator for model states, re-derived from its source, beside offsim's.

DeepSpeed ships two estimators that users run before a job to ask "will it fit":

* ``estimate_zero2_model_states_mem_needs_all_live`` / ``_all_cold`` in
  ``deepspeed/runtime/zero/stage_1_and_2.py`` (read at commit ``02aa38c3a5`` of
  deepspeedai/DeepSpeed), with the inner ``estimate_zero2_model_states_mem_needs``;
* ``estimate_zero3_model_states_mem_needs_all_live`` / ``_all_cold`` in
  ``deepspeed/runtime/zero/stage3.py`` (read at commit ``007cca6a2f``), with the inner
  ``estimate_zero3_model_states_mem_needs``.

The ``_all_live`` functions take a ``torch.nn.Module`` and derive two numbers from it: ``P``, all
parameters, shared tensors counted once (deduplicated by ``data_ptr``); ``Lg``, the most
parameters any one module owns directly (``parameters(recurse=False)``), usually the token
embedding or the LM head. They then print one line per option combination, bytes over 2^30
labelled "GB" (GiB in fact). The formulas below are written from reading those functions (no code
copied); ``g`` is GPUs per node, ``N`` nodes, ``T = g N``, ``F`` ``additional_buffer_factor``
(1.5, applied to the CPU figure only):

ZeRO-2 (no separate stage-1 estimator)::

    offload_optimizer=cpu   GPU 2P             CPU P max(4T, 16) F
    offload_optimizer=none  GPU 2P + 18P/T     CPU 4 g P F

ZeRO-3 (the printed table skips params on CPU with the optimizer on the GPU)::

    param cpu, optim cpu    GPU 4 Lg           CPU 18 P/N F   (zero_init=0: P max(4g, 18/N) F)
    param none, optim cpu   GPU 4 Lg + 2P/T    CPU 16 P/N F   (zero_init=0: P max(4g, 16/N) F)
    param none, optim none  GPU 4 Lg + 18P/T   CPU 4 g Lg F   (zero_init=0: 4 g P F)

The multipliers, as the docs explain them (``docs/code-docs/source/memory.rst``, "Memory
Requirements"): 2 = 16-bit params; 16 = fp32 params, grads, Adam momentum and variance; 18 = 16
plus the 16-bit params; ``4 Lg`` = the 16-bit params and grads of the largest module gathered on
one GPU; ``4 g`` = every process building an fp32 copy of the model at load time without
``zero.Init``. memory.rst still prints the ZeRO-2 ``offload_optimizer=none`` GPU row of an older
formula, ``4P + 16P/T`` (15.93 GiB for its 2851M-parameter example on 8 GPUs), where the current
code gives ``2P + 18P/T`` (11.28 GiB); the two agree only at ``T = 1``.

What the estimator leaves out, and offsim counts (see :mod:`offsim.plan.footprint`): activations
and activation checkpoints, the backward working memory, the gathered-parameter window beyond one
module, reduce and gradient buffers, pinned staging and swap buffers, the CUDA context and
allocator reserve, the start-up transients of pinning (pageable sources of ``pin_memory()``
copies) and of the first optimizer step, and NVMe (it has no NVMe rows).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from offsim.config.run import RunConfig
from offsim.config.workload import ModelShape

#: DeepSpeed's default ``additional_buffer_factor`` (stage3.py, stage_1_and_2.py).
BUFFER_FACTOR = 1.5


def zero2_bytes(params: float, gpus_per_node: int, nodes: int, offload_optimizer: bool,
                buffer_factor: float = BUFFER_FACTOR) -> tuple[float, float]:
    """``(cpu_bytes, gpu_bytes)`` of ZeRO-2's model states as DeepSpeed estimates them
    (``estimate_zero2_model_states_mem_needs``, stage_1_and_2.py): CPU per node, GPU per GPU.

    Args:
        params: all model parameters ``P`` (tied weights once).
        gpus_per_node: ``g``.
        nodes: ``N``.
        offload_optimizer: ``offload_optimizer.device`` is ``cpu``.
        buffer_factor: ``additional_buffer_factor`` (CPU only).
    """
    total_gpus = gpus_per_node * nodes
    if offload_optimizer:
        gpu = 2 * params  # 16-bit params
        cpu = params * max(4 * total_gpus, 16) * buffer_factor  # T, not g: as the code has it
    else:
        gpu = 2 * params + int(18 * params / total_gpus)
        cpu = params * 4 * gpus_per_node * buffer_factor  # fp32 model per process at load
    return float(int(cpu)), float(int(gpu))


def zero3_bytes(params: float, largest_layer_params: float, gpus_per_node: int, nodes: int, *,
                offload_optimizer: bool, offload_param: bool, zero_init: bool = True,
                buffer_factor: float = BUFFER_FACTOR) -> tuple[float, float]:
    """``(cpu_bytes, gpu_bytes)`` of ZeRO-3's model states as DeepSpeed estimates them
    (``estimate_zero3_model_states_mem_needs``, stage3.py): CPU per node, GPU per GPU.

    ``offload_param`` without ``offload_optimizer`` is treated as neither, as DeepSpeed's inner
    function does (its table leaves that combination out).

    Args:
        params: all model parameters ``P`` (tied weights once).
        largest_layer_params: ``Lg``, the most parameters one module owns directly.
        gpus_per_node: ``g``.
        nodes: ``N``.
        offload_optimizer: ``offload_optimizer.device`` is ``cpu``.
        offload_param: ``offload_param.device`` is ``cpu``.
        zero_init: the model is built under ``deepspeed.zero.Init`` (partitioned as created).
        buffer_factor: ``additional_buffer_factor`` (CPU only).
    """
    total_gpus = gpus_per_node * nodes
    per_node = 1 / nodes  # DeepSpeed's gpus_factor
    gathered = 4 * largest_layer_params  # 16-bit params + 16-bit grads of one module
    if offload_optimizer and offload_param:
        gpu = gathered
        per_param = 18 * per_node if zero_init else max(4 * gpus_per_node, 18 * per_node)
        cpu = params * per_param * buffer_factor
    elif offload_optimizer:
        gpu = gathered + int(2 * params / total_gpus)
        per_param = 16 * per_node if zero_init else max(4 * gpus_per_node, 16 * per_node)
        cpu = params * per_param * buffer_factor
    else:
        gpu = gathered + int(18 * params / total_gpus)
        loaded = largest_layer_params if zero_init else params
        cpu = loaded * 4 * gpus_per_node * buffer_factor
    return float(int(cpu)), float(int(gpu))


@dataclass(frozen=True)
class EstimatorRow:
    """One line of DeepSpeed's printed estimator table.

    Attributes:
        stage: ZeRO stage of the estimator (2 or 3).
        offload_optimizer: ``offload_optimizer.device`` is ``cpu``.
        offload_param: ``offload_param.device`` is ``cpu`` (stage 3 only).
        zero_init: built under ``zero.Init`` (stage 3 only; None for stage 2).
        cpu_bytes: host bytes per node, ``additional_buffer_factor`` included.
        gpu_bytes: bytes per GPU.
    """

    stage: int
    offload_optimizer: bool
    offload_param: bool
    zero_init: bool | None
    cpu_bytes: float
    gpu_bytes: float

    @property
    def options(self) -> str:
        """The options as DeepSpeed prints them."""
        optim = f"offload_optimizer={'cpu' if self.offload_optimizer else 'none'}"
        if self.stage == 2:
            return optim
        param = f"offload_param={'cpu' if self.offload_param else 'none'}"
        return f"{param}, {optim}, zero_init={int(bool(self.zero_init))}"

    def to_dict(self) -> dict[str, Any]:
        """The fields and the options text, JSON-ready."""
        return {**asdict(self), "options": self.options}


def estimator_table(params: float, largest_layer_params: float, gpus_per_node: int, nodes: int,
                    buffer_factor: float = BUFFER_FACTOR) -> list[EstimatorRow]:
    """Every line the two ``_all_cold`` functions print, in their order: ZeRO-2 (optimizer on CPU,
    then none), then ZeRO-3 (params and optimizer on CPU, optimizer only, neither; each with
    ``zero_init`` 1 then 0)."""
    rows = []
    for offload in (True, False):
        cpu, gpu = zero2_bytes(params, gpus_per_node, nodes, offload, buffer_factor)
        rows.append(EstimatorRow(2, offload, False, None, cpu, gpu))
    for optim, param in ((True, True), (True, False), (False, False)):
        for init in (True, False):
            cpu, gpu = zero3_bytes(params, largest_layer_params, gpus_per_node, nodes, offload_optimizer=optim,
                                   offload_param=param, zero_init=init, buffer_factor=buffer_factor)
            rows.append(EstimatorRow(3, optim, param, init, cpu, gpu))
    return rows


def largest_module_params(model: ModelShape) -> int:
    """``Lg`` as ``model_to_params`` (stage3.py) finds it in a Hugging Face model: the most
    parameters one module owns directly, i.e. the biggest single weight: the token embedding,
    the LM head (same size; one module when tied), the learned position table, an attention
    projection, a dense MLP matrix, one routed expert's matrix (transformers v4 keeps one module
    per expert; v5's fused expert tensors would make it the whole layer's experts), a shared
    expert's matrix or the router. Biases (``bias: true``, at most ``ffn_hidden`` elements per
    module) are left out."""
    h = model.hidden
    sizes = [model.vocab * h, *model.attention_matrices()]
    if model.learned_positions:
        sizes.append(model.max_positions * h)
    moe = model.moe
    if moe is None or len(moe.dense_layers) > 0:
        sizes.append(h * model.ffn_hidden)
    if moe is not None:
        sizes += [h * moe.expert_ffn_hidden, moe.experts * h]
        if moe.shared_experts:
            sizes.append(h * moe.shared_experts * moe.shared_width)
    return max(sizes)


@dataclass(frozen=True)
class EstimatorSetup:
    """What offsim passes to DeepSpeed's estimator for one run.

    Attributes:
        params: ``P``, the model's parameters (the whole model, not a tensor-parallel share).
        largest_layer_params: ``Lg``.
        gpus_per_node: ``g``: the job's GPUs on one node.
        nodes: ``N``: nodes the job's GPUs span.
    """

    params: int
    largest_layer_params: int
    gpus_per_node: int
    nodes: int

    def table(self) -> list[EstimatorRow]:
        """DeepSpeed's table for this setup (:func:`estimator_table`)."""
        return estimator_table(self.params, self.largest_layer_params, self.gpus_per_node, self.nodes)


def estimator_setup(cfg: RunConfig) -> EstimatorSetup:
    """The estimator's inputs for ``cfg``: all GPUs of the job (data x tensor parallel), as many
    on a node as the profile holds."""
    model, training = cfg.workload.model, cfg.workload.training
    gpus = training.data_parallel * training.tensor_parallel
    per_node = min(gpus, cfg.hardware.topology.gpus_per_node)
    return EstimatorSetup(model.total_params, largest_module_params(model), per_node, math.ceil(gpus / per_node))


def matching_row(cfg: RunConfig, rows: list[EstimatorRow]) -> EstimatorRow | None:
    """The estimator line nearest to ``cfg``'s strategy: same ZeRO stage (2 or 3), optimizer
    state and (stage 3) parameters on the CPU or the GPU as the strategy places them, built under
    ``zero.Init`` (what the Hugging Face integration does for stage 3). None where the estimator
    has no such line: stages 0 and 1, anything on NVMe, parameters on the CPU below stage 3, a
    share of the optimizer updated on the GPU (Twin-Flow's ``ratio``)."""
    st = cfg.strategy
    pl = st.placement
    if st.zero_stage < 2 or "nvme" in (pl.params, pl.optimizer_states) or st.optimizer_gpu_fraction > 0:
        return None
    optim = pl.optimizer_states == "cpu"
    param = pl.params == "cpu"
    if param and (st.zero_stage == 2 or not optim):
        return None
    for row in rows:
        if (row.stage, row.offload_optimizer, row.offload_param) == (st.zero_stage, optim, param) \
                and row.zero_init in (None, True):
            return row
    return None

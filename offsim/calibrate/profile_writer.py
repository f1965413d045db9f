"""Turn fits into a :class:`~offsim.config.hardware.HardwareProfile` and write every output file.

The profile starts from the optional base profile; each field the harness measured replaces the
base's value. Every leaf field is tagged with where its value came from:

* ``measured``: taken on this machine by the harness (or read from it: device name, memory size);
* ``given``: passed in the settings (``peak_tflops``, ``nvme_drives``);
* ``datasheet``: from the datasheet table :data:`offsim.calibrate.gpu.KNOWN_PEAKS`;
* ``base``: copied from the base profile;
* ``derived``: follows from the measurement's definition (``nvme.raid_efficiency`` = 1 because
  per-drive rates are the array rate divided by the drive count).

``provenance.kind`` is ``measured`` when nothing came from ``base``, ``given`` or ``datasheet``,
else ``mixed``; ``provenance.notes`` lists the fields by origin. Without GPU measurements and
without a base profile no complete profile can be built: the raw CSVs and ``fits.json`` are still
written, and nothing is invented for the GPU.
"""

from __future__ import annotations

import copy
import csv
import datetime as _dt
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import offsim
from offsim.calibrate.common import TABLE_FILES, CalibrationSettings, PartResult
from offsim.calibrate.fit import best_optimizer, finite
from offsim.config.hardware import HardwareProfile
from offsim.config.loading import validate_data
from offsim.errors import ConfigError
from offsim.units import GiB

#: Fields a profile cannot do without (pydantic would refuse it).
REQUIRED = (
    "gpu.model",
    "gpu.memory_gib",
    "gpu.hbm_bandwidth_gb_per_s",
    "gpu.peak_tflops",
    "gpu.gemm_efficiency",
    "gpu.copy_engines",
    *(f"host_link.{d}.{m}.bandwidth_gb_per_s" for d in ("h2d", "d2h") for m in ("pinned", "pageable")),
    "cpu.model",
    "cpu.cores",
    "cpu.optimizer_params_per_s",
    "cpu.memcpy_gb_per_s",
    "dram.capacity_gib",
    "dram.bandwidth_gb_per_s",
)
NVME_REQUIRED = ("nvme.model", "nvme.drives", "nvme.read_gb_per_s", "nvme.write_gb_per_s", "nvme.capacity_tb")
SECTIONS = ("gpu", "host_link", "cpu", "dram", "nvme", "topology", "price_usd_per_hour")


def sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (readable YAML, no false precision)."""
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


@dataclass
class ProfileBuild:
    """The assembled profile and what is known about each field.

    Attributes:
        data: the profile as a dict (possibly incomplete).
        profile: the validated profile, or None when incomplete or invalid.
        origins: dotted field path -> ``measured`` / ``given`` / ``datasheet`` / ``base`` / ``derived``.
        missing: required fields nobody could supply.
        messages: why the profile is incomplete, or what was adjusted.
    """

    data: dict[str, Any]
    profile: HardwareProfile | None = None
    origins: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    # -- helpers ------------------------------------------------------------------------------
    def get(self, path: str) -> Any:
        cur: Any = self.data
        for key in path.split("."):
            if not isinstance(cur, dict) or key not in cur:
                return None
            cur = cur[key]
        return cur

    def set(self, path: str, value: Any, origin: str) -> None:
        keys = path.split(".")
        cur = self.data
        for key in keys[:-1]:
            cur = cur.setdefault(key, {})
        cur[keys[-1]] = value
        for k in [k for k in self.origins if k == path or k.startswith(path + ".")]:
            del self.origins[k]
        self.origins[path] = origin

    def by_origin(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for path, origin in sorted(self.origins.items()):
            out[origin].append(path)
        return dict(out)


def _leaves(prefix: str, value: Any, out: dict[str, str], origin: str) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _leaves(f"{prefix}.{k}", v, out, origin)
    elif value is not None:
        out[prefix] = origin


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value


def _compact(paths: list[str], all_origins: dict[str, str]) -> str:
    """``gpu.*`` when a whole section shares one origin, else the field paths."""
    out: list[str] = []
    sections: dict[str, list[str]] = defaultdict(list)
    for p in paths:
        sections[p.split(".")[0]].append(p)
    for sec, ps in sections.items():
        total = [p for p in all_origins if p.split(".")[0] == sec]
        out.append(f"{sec}.*" if len(ps) == len(total) and len(ps) > 1 else ", ".join(ps))
    return "; ".join(out)


def _gpu_fields(
    b: ProfileBuild,
    fits: dict[str, Any],
    gpu: PartResult | None,
    base: HardwareProfile | None,
    msgs: list[str],
) -> None:
    info = gpu.info if gpu is not None else {}
    name = info.get("name")
    if not name:
        return
    if base is not None and base.gpu.model != name:
        msgs.append(
            f"base profile '{base.name}' describes GPU '{base.gpu.model}' but '{name}' was measured: "
            "GPU fields not measured here are taken from the base and may not fit this GPU"
        )
    b.set("gpu.model", name, "measured")
    if info.get("total_memory"):
        b.set("gpu.memory_gib", sig(info["total_memory"] / GiB, 6), "measured")
        reserved = b.get("gpu.reserved_gib")
        if reserved is not None and reserved >= b.get("gpu.memory_gib"):
            b.set("gpu.reserved_gib", 1.0, "derived")
    if info.get("copy_engines"):
        b.set("gpu.copy_engines", int(info["copy_engines"]), "measured")
    hbm = fits.get("hbm", {}).get("gb_per_s")
    if finite(hbm):
        b.set("gpu.hbm_bandwidth_gb_per_s", sig(hbm), "measured")
    gemm = fits.get("gemm", {})
    if gemm.get("peak_tflops"):
        b.set("gpu.peak_tflops", {k: float(v) for k, v in gemm["peak_tflops"].items()}, gemm["peak_source"])
    if gemm.get("efficiency"):
        b.set("gpu.gemm_efficiency", [[sig(g), sig(f)] for g, f in gemm["efficiency"]], "measured")


def _host_link_fields(b: ProfileBuild, fits: dict[str, Any], gpu: PartResult | None, msgs: list[str]) -> None:
    transfers = fits.get("transfers", {})
    info = gpu.info if gpu is not None else {}
    measured_any = False
    for d in ("h2d", "d2h"):
        for m in ("pinned", "pageable"):
            tf = transfers.get(f"{d}/{m}/alone")
            if not tf or not tf.get("fit"):
                continue
            fit = tf["fit"]
            pts = [[float(int(s)), sig(r)] for s, r in tf["points_bytes_gb_per_s"]]
            curve = {
                "bandwidth_gb_per_s": sig(fit["bandwidth_gb_per_s"]),
                "latency_us": sig(fit["latency_us"]),
            }
            if len(pts) >= 2:
                curve["points"] = pts  # type: ignore[assignment]
            b.set(f"host_link.{d}.{m}", curve, "measured")
            measured_any = True
        pin = b.get(f"host_link.{d}.pinned.bandwidth_gb_per_s")
        pag = b.get(f"host_link.{d}.pageable.bandwidth_gb_per_s")
        if pin is not None and pag is not None and pag > pin:
            msgs.append(
                f"{d}: pageable copies fitted faster than pinned ({pag} vs {pin} GB/s); the profile "
                "caps pageable bandwidth at the pinned one (the schema requires pageable <= pinned)"
            )
            b.data["host_link"][d]["pageable"]["bandwidth_gb_per_s"] = pin
    if not measured_any:
        return
    if fits.get("duplex_efficiency") is not None:
        b.set("host_link.duplex_efficiency", sig(fits["duplex_efficiency"], 3), "measured")
    name = str(info.get("name", ""))
    b.set("host_link.kind", "nvlink-c2c" if "GH200" in name or "GB200" in name else "pcie", "measured")
    gen, width = info.get("pcie_gen_max"), info.get("pcie_width_max")
    if isinstance(gen, int) and 1 <= gen <= 7:
        b.set("host_link.generation", gen, "measured")
    if isinstance(width, int) and 1 <= width <= 32:
        b.set("host_link.lanes", width, "measured")


def _cpu_fields(
    b: ProfileBuild, fits: dict[str, Any], cpu: PartResult | None, system: dict[str, Any]
) -> None:
    facts = system.get("cpu", {})
    if cpu is None or not cpu.rows("cpu"):
        return
    cfit = fits.get("cpu", {})
    b.set("cpu.model", str(facts.get("model") or "unknown"), "measured")
    b.set("cpu.sockets", int(facts.get("sockets") or 1), "measured")
    b.set("cpu.cores", int(facts.get("physical_cores") or facts.get("logical_cpus") or 1), "measured")
    best = best_optimizer(cfit)
    if best is not None:
        impl, rate = best
        b.set("cpu.optimizer_params_per_s", sig(rate), "measured")
        b.set("cpu.optimizer_rate_origin", "measured", "measured")  # an override of the CPU Adam model
        b.set("cpu.optimizer_impl", impl, "measured")
    memcpy = cfit.get("memcpy", {})
    if "1" in memcpy:
        b.set("cpu.memcpy_gb_per_s", sig(memcpy["1"]["gb_per_s"]), "measured")
    if "page_touch_gb_per_s" in cfit:
        b.set("cpu.page_touch_gb_per_s", sig(cfit["page_touch_gb_per_s"]), "measured")
    if memcpy:
        best_copy = max(v["gb_per_s"] for v in memcpy.values())
        b.set("dram.bandwidth_gb_per_s", sig(2 * best_copy), "measured")
    mem = system.get("memory_total_bytes")
    if mem:
        b.set("dram.capacity_gib", sig(mem / GiB, 5), "measured")


def _nvme_fields(
    b: ProfileBuild,
    fits: dict[str, Any],
    nvme: PartResult | None,
    base: HardwareProfile | None,
    msgs: list[str],
) -> None:
    nfit = fits.get("nvme", {})
    if nvme is None or "read" not in nfit or "write" not in nfit:
        return
    info = nvme.info
    drives, drives_origin = nfit["drives"], nfit.get("drives_origin", "measured")
    model = info.get("model") or (
        f"{info['block_device']} (model not reported)" if info.get("block_device") else "unknown"
    )
    b.set("nvme.model", str(model), "measured")
    b.set("nvme.drives", int(drives), drives_origin)
    b.set("nvme.read_gb_per_s", sig(nfit["read"]["per_drive_gb_per_s"]), "measured")
    b.set("nvme.write_gb_per_s", sig(nfit["write"]["per_drive_gb_per_s"]), "measured")
    b.set("nvme.raid_efficiency", 1.0, "derived")
    lat = nfit.get("latency", {})
    if lat and lat.get("latency_us") is not None:
        b.set("nvme.latency_us", sig(max(0.0, lat["latency_us"])), "measured")
    if info.get("disk_total_bytes"):
        b.set("nvme.capacity_tb", sig(info["disk_total_bytes"] / 1e12 / drives), "measured")
    sus = nfit.get("sustained", {})
    if sus.get("drop"):
        b.set("nvme.post_cache_write_gb_per_s", sig(sus["post_cache_per_drive_gb_per_s"]), "measured")
        b.set("nvme.write_cache_gb", sig(max(sus["cache_per_drive_gb"], 1e-6)), "measured")
    elif sus:
        written = sus.get("total_bytes", 0) / 1e9
        kept = "kept from the base profile" if b.get("nvme.write_cache_gb") is not None else "left unset"
        msgs.append(
            f"NVMe sustained write showed no drop in {written:.3g} GB: any write cache is larger than "
            f"that; post_cache_write_gb_per_s and write_cache_gb {kept}"
        )
    if b.get("nvme.post_cache_write_gb_per_s") is not None and b.get("nvme.write_cache_gb") is None:
        b.data["nvme"].pop("post_cache_write_gb_per_s")
        b.origins.pop("nvme.post_cache_write_gb_per_s", None)


def _tool(system: dict[str, Any], parts: dict[str, PartResult]) -> str:
    """The provenance ``tool``: offsim's version and the library and driver versions measured with."""
    gpu = parts.get("gpu")
    driver = gpu.info.get("driver_version") if gpu else None
    return (
        f"offsim {offsim.__version__} calibrate (numpy {system.get('numpy')}, torch {system.get('torch')}, "
        f"CUDA {system.get('torch_cuda')}" + (f", driver {driver}" if driver else "") + ")"
    )


def _provenance_notes(
    b: ProfileBuild, fits: dict[str, Any], parts: dict[str, PartResult], settings: CalibrationSettings,
    msgs: list[str],
) -> list[str]:
    """Where each field came from, the device, the settings, the optimizer measured, the warnings."""
    notes = [f"{origin}: {_compact(paths, b.origins)}" for origin, paths in b.by_origin().items()]
    gpu_info = parts["gpu"].info if parts.get("gpu") else {}
    if gpu_info.get("name"):
        notes.append(
            f"device: {gpu_info['name']} ({gpu_info.get('total_memory', 0) / GiB:.1f} GiB, "
            f"copy engines {gpu_info.get('copy_engines', '?')})"
        )
    notes.append(
        f"settings: {'quick' if settings.quick else 'full'} mode; statistics are medians of repeats; "
        "dram.bandwidth_gb_per_s = 2 x the best np.copyto rate (read + write, STREAM copy convention)"
    )
    best = best_optimizer(fits.get("cpu", {}))
    if best is not None and b.origins.get("cpu.optimizer_params_per_s") == "measured":
        impl = best[0]
        opt = fits["cpu"]["optimizer"][impl]
        notes.append(
            f"cpu.optimizer_params_per_s: {impl}, fp32, {opt['params']:,} params, {opt['threads']} threads"
            + (
                " (PyTorch was missing: a numpy AdamW, slower than torch or DeepSpeed CPU-Adam)"
                if impl == "numpy-adamw"
                else ""
            )
        )
    return notes + msgs


def _provenance(
    b: ProfileBuild, fits: dict[str, Any], parts: dict[str, PartResult], system: dict[str, Any],
    base: HardwareProfile | None, settings: CalibrationSettings, msgs: list[str], date: str,
) -> dict[str, Any]:
    """The profile's ``provenance`` block: measured or mixed, sources, tool, host, notes."""
    by = b.by_origin()
    host = system.get("host", "unknown")
    source = f"offsim calibrate on host {host}"
    if "base" in by and base is not None:
        source += f"; fields not measured come from base profile '{base.name}' ({base.provenance.source})"
    if "datasheet" in by:
        source += "; peak TFLOPS from datasheet table in offsim.calibrate.gpu (hardware_facts.md section 1.1)"
    return {
        "kind": "mixed" if set(by) - {"measured", "derived"} else "measured",
        "source": source,
        "date": date,
        "tool": _tool(system, parts),
        "host": host,
        "notes": "\n".join(_provenance_notes(b, fits, parts, settings, msgs)),
    }


def build_profile(
    name: str,
    *,
    fits: dict[str, Any],
    parts: dict[str, PartResult],
    system: dict[str, Any],
    base: HardwareProfile | None,
    settings: CalibrationSettings,
    date: str | None = None,
) -> ProfileBuild:
    """Assemble (and validate) the profile; see the module docstring for the rules."""
    b = ProfileBuild(data={})
    msgs: list[str] = []
    if base is not None:
        dumped = base.model_dump(mode="json")
        for sec in SECTIONS:
            if dumped.get(sec) is not None:
                b.data[sec] = copy.deepcopy(dumped[sec])
                _leaves(sec, dumped[sec], b.origins, "base")
    _gpu_fields(b, fits, parts.get("gpu"), base, msgs)
    _host_link_fields(b, fits, parts.get("gpu"), msgs)
    _cpu_fields(b, fits, parts.get("cpu"), system)
    _nvme_fields(b, fits, parts.get("nvme"), base, msgs)

    b.missing = [p for p in REQUIRED if b.get(p) is None]
    if b.get("nvme") is not None:
        b.missing += [p for p in NVME_REQUIRED if b.get(p) is None]
    date = date or _dt.date.today().isoformat()
    host = system.get("host", "unknown")
    b.data = {
        "schema_version": 1,
        "name": name,
        "description": f"Measured by offsim calibrate on {host} ({date})"
        + (f", base profile {base.name}" if base is not None else ""),
        "provenance": _provenance(b, fits, parts, system, base, settings, msgs, date),
        **{k: v for k, v in b.data.items()},
    }
    b.data = _drop_none(b.data)
    b.messages = msgs
    if b.missing:
        return b
    try:
        b.profile = validate_data(HardwareProfile, b.data, f"calibrated profile '{name}'")
    except ConfigError as exc:
        b.messages.append(f"the assembled profile does not validate: {exc}")
    return b


# ---------------------------------------------------------------------------------------------
# Files


def _plain(value: Any) -> Any:
    """JSON/YAML-safe copy: numpy scalars to Python, NaN/inf to None, tuples to lists, Paths to str."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """One row per measurement; the columns are the union of the rows' keys, first seen first."""
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})
    return path


def write_tables(out_dir: Path, parts: dict[str, PartResult]) -> list[Path]:
    """``raw_*.csv`` for every table that has rows."""
    tables: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for part in parts.values():
        for name, rows in part.tables.items():
            tables[name].extend(rows)
    return [write_csv(out_dir / TABLE_FILES[name], rows) for name, rows in tables.items() if rows]


def write_json(path: Path, data: dict[str, Any]) -> Path:
    """``fits.json`` (or any other JSON document), NaN-free."""
    path.write_text(json.dumps(_plain(data), indent=2, allow_nan=False) + "\n")
    return path


class _Dumper(yaml.SafeDumper):
    """Block-style mappings; lists of scalars inline (``[4096.0, 1.25]``); multi-line text as ``|``."""


def _repr_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(v, dict | list) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _repr_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(list, _repr_list)
_Dumper.add_representer(str, _repr_str)


def write_profile_yaml(path: Path, data: dict[str, Any]) -> Path:
    """The profile as YAML, in schema order, point lists inline."""
    header = (
        "# Written by `offsim calibrate`. provenance.notes says which fields were measured on this\n"
        "# machine and which came from elsewhere; raw data and fit residuals sit beside this file.\n"
    )
    body = yaml.dump(_plain(data), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=110)
    path.write_text(header + body)
    return path

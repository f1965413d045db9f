"""``run_calibration``: run the requested parts, fit, build the profile, write every file."""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offsim.calibrate import cpu as cpu_mod
from offsim.calibrate import gpu as gpu_mod
from offsim.calibrate import nvme as nvme_mod
from offsim.calibrate.common import (
    PARTS,
    CalibrationSettings,
    PartResult,
    Progress,
    Reporter,
    fmt_bytes,
    median,
    system_facts,
)
from offsim.calibrate.fit import (
    duplex_efficiency,
    fit_cpu,
    fit_nvme,
    fit_transfers,
    gemm_efficiency_points,
    medians_by,
)
from offsim.calibrate.profile_writer import (
    ProfileBuild,
    build_profile,
    write_json,
    write_profile_yaml,
    write_tables,
)
from offsim.config.hardware import HardwareProfile
from offsim.errors import ConfigError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
#: A fit worse than this (RMS relative error) is reported as a message.
POOR_FIT_RMS = 0.15


@dataclass
class CalibrationReport:
    """What a calibration run measured and wrote.

    Attributes:
        out_dir: the output folder.
        name: the profile name (``<out_dir>/<name>.yaml``).
        profile: the validated profile, or None when no complete profile could be built.
        profile_path: where it was written (None when not written).
        complete: a complete, validated profile was written and loads with ``load_profile``.
        parts: per part (``gpu``, ``cpu``, ``nvme``): status, messages, raw rows, machine facts.
        fits: everything written to ``fits.json`` (fits with residuals, summaries, system facts).
        files: every file written.
        messages: the lines a user must see (skips, fallbacks, poor fits, why no profile).
        origins: profile field -> where its value came from (``measured``, ``base``, ...).
    """

    out_dir: Path
    name: str
    profile: HardwareProfile | None
    profile_path: Path | None
    complete: bool
    parts: dict[str, PartResult]
    fits: dict[str, Any]
    files: list[Path] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)

    def summary_lines(self) -> list[str]:
        """A short human summary (for the CLI)."""
        lines = [f"{p}: {r.status}" for p, r in self.parts.items()]
        if self.profile_path is not None:
            kind = self.profile.provenance.kind if self.profile else "?"
            lines.append(f"profile: {self.profile_path} (provenance: {kind})")
        else:
            lines.append("profile: none written (see messages)")
        lines += [f"wrote {p}" for p in self.files if p != self.profile_path]
        return lines


# ---------------------------------------------------------------------------------------------
# Fits


def _resolve_peak(
    settings: CalibrationSettings, base: HardwareProfile | None, device: str | None
) -> tuple[dict[str, float] | None, str | None]:
    if settings.peak_tflops:
        return {str(k): v for k, v in settings.peak_tflops.items()}, "given"
    if base is not None and device and base.gpu.model == device:
        return {str(k): v for k, v in base.gpu.peak_tflops.items()}, "base"
    table = gpu_mod.known_peak_tflops(device) if device else None
    if table:
        return table, "datasheet"
    if base is not None:
        return {str(k): v for k, v in base.gpu.peak_tflops.items()}, "base"
    return None, None


def _peak_for(peaks: dict[str, float], dtype: str) -> float | None:
    alias = {"bf16": "fp16", "fp16": "bf16"}.get(dtype)
    return peaks.get(dtype) or (peaks.get(alias) if alias else None)


def _nvme_drives(
    settings: CalibrationSettings, base: HardwareProfile | None, nvme: PartResult | None
) -> tuple[int, str]:
    if settings.nvme_drives:
        return settings.nvme_drives, "given"
    if base is not None and base.nvme is not None:
        return base.nvme.drives, "base"
    members = (nvme.info.get("members") if nvme else None) or []
    if len(members) > 1:
        return len(members), "measured"
    return 1, "measured"


def _summarize_transfers(gpu: PartResult, rep: Reporter) -> dict[str, Any]:
    tfits = fit_transfers(gpu.rows("transfers"))
    for k, v in tfits.items():
        if v.fit is None:
            rep.warn(f"transfer fit {k} failed: {v.error}", gpu)
            continue
        rep.say(f"[fit] {k}: {v.fit.summary()}")
        if v.fit.rms_rel_error > POOR_FIT_RMS:
            rep.warn(
                f"transfer fit {k}: RMS relative error {v.fit.rms_rel_error:.0%} (max "
                f"{v.fit.max_rel_error:.0%}); latency + size/bandwidth describes these copies poorly; "
                "the profile keeps the measured points, which the simulator uses instead",
                gpu,
            )
    return {
        "transfers": {k: v.to_dict() for k, v in tfits.items()},
        "duplex_efficiency": duplex_efficiency(tfits),
    }


def _summarize_gemm(
    gpu: PartResult, settings: CalibrationSettings, base: HardwareProfile | None, rep: Reporter
) -> dict[str, Any]:
    peaks, source = _resolve_peak(settings, base, gpu.info.get("name"))
    gemm: dict[str, Any] = {"peak_tflops": peaks, "peak_source": source, "by_dtype": {}}
    for dt in settings.gemm_dtypes:
        peak = _peak_for(peaks or {}, dt)
        rows = [r for r in gpu.rows("gemm") if r["kind"] == "gemm" and r["dtype"] == dt]
        med = medians_by(rows, ("m", "n", "k"), "tflops")
        entry: dict[str, Any] = {
            "tflops_by_shape": [[m, n, k, v] for (m, n, k), v in sorted(med.items())],
            "peak_tflops": peak,
        }
        if peak and rows:
            pts, msgs = gemm_efficiency_points(rows, peak, dt)
            entry["efficiency"] = pts
            for m in msgs:
                rep.warn(m, gpu)
            if "efficiency" not in gemm:
                gemm["efficiency"], gemm["efficiency_dtype"] = pts, dt
        gemm["by_dtype"][dt] = entry
    if gpu.rows("gemm") and not peaks:
        rep.warn(
            "GEMM efficiency not computed: no peak TFLOP/s known for "
            f"'{gpu.info.get('name')}' (give settings.peak_tflops or a base profile)",
            gpu,
        )
    blocks = [r for r in gpu.rows("gemm") if r["kind"].startswith("block_")]
    flop = {r["kind"]: r["flop"] for r in blocks}
    gemm["block"] = {
        k: {"time_s": v, "tflops": flop[k] / v / 1e12}
        for (k,), v in medians_by(blocks, ("kind",), "time_s").items()
    }
    return gemm


def _summarize_nvme(
    nvme: PartResult, settings: CalibrationSettings, base: HardwareProfile | None, rep: Reporter
) -> dict[str, Any]:
    drives, origin = _nvme_drives(settings, base, nvme)
    nfit = fit_nvme(nvme.rows("nvme"), drives)
    nfit["drives_origin"] = origin
    for op in ("read", "write"):
        if op in nfit:
            rep.say(
                f"[fit] nvme {op}: {nfit[op]['array_gb_per_s']:.3f} GB/s best "
                f"({nfit[op]['per_drive_gb_per_s']:.3f} per drive, {drives} drive(s))"
            )
    sus = nfit.get("sustained", {})
    if sus.get("drop"):
        rep.say(
            f"[fit] nvme write cache: {sus['early_gb_per_s']:.2f} -> {sus['late_gb_per_s']:.2f} GB/s "
            f"after {fmt_bytes(sus['cache_bytes'])}"
        )
    nfit["info"] = nvme.info
    return nfit


def summarize(
    parts: dict[str, PartResult], settings: CalibrationSettings, base: HardwareProfile | None, rep: Reporter
) -> dict[str, Any]:
    """Every fit and summary that goes into ``fits.json``; poor fits become messages."""
    out: dict[str, Any] = {}
    gpu = parts.get("gpu")
    if gpu is not None and gpu.tables:
        out.update(_summarize_transfers(gpu, rep))
        out["gemm"] = _summarize_gemm(gpu, settings, base, rep)
        if gpu.rows("hbm"):
            out["hbm"] = {
                "gb_per_s": median(r["gb_per_s"] for r in gpu.rows("hbm")),
                "convention": "read + write bytes per second",
            }
        pin = medians_by(gpu.rows("pinning"), ("method", "size_bytes"), "s_per_gib")
        out["pinning_s_per_gib"] = [
            {"method": m, "size_bytes": s, "s_per_gib": v} for (m, s), v in sorted(pin.items())
        ]
        out["gpu_info"] = gpu.info
    cpu = parts.get("cpu")
    if cpu is not None and cpu.rows("cpu"):
        out["cpu"] = fit_cpu(cpu.rows("cpu"))
    nvme = parts.get("nvme")
    if nvme is not None and nvme.rows("nvme"):
        out["nvme"] = _summarize_nvme(nvme, settings, base, rep)
    return out


# ---------------------------------------------------------------------------------------------
# The entry point


def run_calibration(
    out_dir: Path,
    *,
    base_profile: HardwareProfile | None = None,
    name: str = "measured",
    nvme_dir: Path | None = None,
    quick: bool = False,
    parts: Collection[str] | None = None,
    progress: Progress | None = None,
    settings: CalibrationSettings | None = None,
) -> CalibrationReport:
    """Measure this machine, fit, and write ``<out_dir>/<name>.yaml`` plus raw CSVs and ``fits.json``.

    Args:
        out_dir: output folder (created if missing).
        base_profile: supplies every field that is not measured (GPU fields on a machine
            without CUDA, for example); None: only measured fields.
        name: profile name (``^[a-z0-9][a-z0-9._-]*$``) and file stem.
        nvme_dir: a folder on the drive to measure; None skips the NVMe part with a message.
        quick: a few sizes, small buffers and short runs (minutes instead of tens of minutes);
            ignored when ``settings`` is given (``settings.quick`` applies).
        parts: subset of ``{"gpu", "cpu", "nvme"}``; None: all three.
        progress: called with one line of text per step (e.g. ``typer.echo``).
        settings: every knob (:class:`CalibrationSettings`); None: ``CalibrationSettings.preset(quick)``.

    Returns:
        The report; ``report.complete`` tells whether a profile was written. A part that cannot
        run (no torch/CUDA, bad NVMe folder) is skipped with one message and the rest runs.

    Raises:
        ConfigError: a bad ``name``, unknown ``parts``, or an output folder that cannot be written.
    """
    wanted = _check_request(name, parts)
    settings = settings or CalibrationSettings.preset(quick)
    out_dir = _make_out_dir(Path(out_dir))

    rep = Reporter(progress)
    system = system_facts()
    rep.say(
        f"calibrating {system['host']} ({'quick' if settings.quick else 'full'} mode): "
        f"{', '.join(p for p in PARTS if p in wanted)}"
    )
    results = _run_parts(wanted, settings, nvme_dir, rep)
    fits = summarize(results, settings, base_profile, rep)
    build = build_profile(name, fits=fits, parts=results, system=system, base=base_profile, settings=settings)
    for m in build.messages:
        rep.warn(m)
    return _write_outputs(out_dir, name, system, settings, base_profile, results, fits, build, rep)


def _make_out_dir(out_dir: Path) -> Path:
    """``out_dir``, created if missing; one that cannot be created is a :class:`ConfigError`."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out_dir}: cannot create the output folder ({exc.strerror})") from None
    return out_dir


def _write_outputs(
    out_dir: Path,
    name: str,
    system: dict[str, Any],
    settings: CalibrationSettings,
    base_profile: HardwareProfile | None,
    results: dict[str, PartResult],
    fits: dict[str, Any],
    build: ProfileBuild,
    rep: Reporter,
) -> CalibrationReport:
    """Write the raw tables, the profile (when complete and it loads back) and ``fits.json``;
    the report of the whole run."""
    files = write_tables(out_dir, results)
    profile, profile_path = _write_profile(out_dir, name, build, base_profile, rep)
    if profile_path is not None:
        files.append(profile_path)
    kept = profile_path if profile is not None else None  # a profile that does not reload is not kept
    fits_doc = _fits_document(name, system, settings, base_profile, results, fits, build, kept, rep)
    files.append(write_json(out_dir / "fits.json", fits_doc))
    for line in (f"wrote {p}" for p in files):
        rep.say(line)
    return CalibrationReport(
        out_dir=out_dir,
        name=name,
        profile=profile,
        profile_path=kept,
        complete=profile is not None,
        parts=results,
        fits=fits_doc,
        files=files,
        messages=rep.messages,
        origins=build.origins,
    )


def _check_request(name: str, parts: Collection[str] | None) -> set[str]:
    """The parts to run; a bad profile name or an unknown part is a :class:`ConfigError`."""
    if not NAME_RE.match(name):
        raise ConfigError(
            f"profile name '{name}': use lower-case letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    wanted = set(PARTS if parts is None else parts)
    unknown = wanted - set(PARTS)
    if unknown:
        raise ConfigError(
            f"unknown calibration part(s): {', '.join(sorted(unknown))} (choose from {', '.join(PARTS)})"
        )
    return wanted


def _run_parts(
    wanted: set[str], settings: CalibrationSettings, nvme_dir: Path | None, rep: Reporter
) -> dict[str, PartResult]:
    """Run each wanted part; one that raises is recorded as failed and the others still run."""
    runners = {
        "gpu": lambda: gpu_mod.run_gpu_part(settings, rep),
        "cpu": lambda: cpu_mod.run_cpu_part(settings, rep),
        "nvme": lambda: nvme_mod.run_nvme_part(settings, nvme_dir, rep),
    }
    results: dict[str, PartResult] = {}
    for p in PARTS:
        if p not in wanted:
            results[p] = PartResult(p, status="skipped", info={"requested": False})
            continue
        try:
            results[p] = runners[p]()
        except Exception as exc:  # a part's bug must not lose the others' results
            results[p] = PartResult(p, status="failed")
            rep.warn(f"{p} part failed: {type(exc).__name__}: {exc}", results[p])
    return results


def _write_profile(
    out_dir: Path, name: str, build: Any, base_profile: HardwareProfile | None, rep: Reporter
) -> tuple[HardwareProfile | None, Path | None]:
    """Write ``<name>.yaml`` when a complete profile was built and reload it; else say why not.

    Returns the reloaded profile (None when it does not load) and the file written (None when none).
    """
    if build.profile is not None:
        path = write_profile_yaml(out_dir / f"{name}.yaml", build.data)
        return _reload(path, rep), path
    why = f"missing {', '.join(build.missing)}" if build.missing else "it does not validate"
    hint = (
        "; the GPU was not measured and no base profile was given: pass a base profile for the GPU fields"
        if any(m.startswith(("gpu.", "host_link.")) for m in build.missing) and base_profile is None
        else ""
    )
    rep.warn(
        f"No complete profile could be written ({why}){hint}. Raw measurements and fits.json "
        f"are in {out_dir}."
    )
    return None, None


def _fits_document(
    name: str,
    system: dict[str, Any],
    settings: CalibrationSettings,
    base_profile: HardwareProfile | None,
    results: dict[str, PartResult],
    fits: dict[str, Any],
    build: Any,
    profile_path: Path | None,
    rep: Reporter,
) -> dict[str, Any]:
    """The content of ``fits.json``: settings, machine, per-part status, fits and the profile's fate."""
    written = profile_path is not None
    return {
        "offsim_version": system["offsim"],
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "name": name,
        "base_profile": base_profile.name if base_profile is not None else None,
        "settings": settings.as_dict(),
        "system": system,
        "parts": {
            p: {"status": r.status, "messages": r.messages, "info": r.info} for p, r in results.items()
        },
        "fits": fits,
        "profile": {
            "written": written,
            "path": profile_path,
            "missing": build.missing,
            "origins": build.origins,
            "partial_profile": build.data if not written else None,
        },
        "messages": rep.messages,
    }


def _reload(path: Path, rep: Reporter) -> HardwareProfile | None:
    """Load the written file back through the normal loader (the round trip users will do)."""
    from offsim.config.loading import load_profile

    try:
        # bypass load_profile's cache: a second run may rewrite the same path in one process
        return getattr(load_profile, "__wrapped__", load_profile)(str(path))
    except ConfigError as exc:
        rep.warn(f"the written profile does not load back: {exc}")
        return None


__all__ = ["CalibrationReport", "ProfileBuild", "run_calibration"]

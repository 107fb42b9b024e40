"""The memory estimator against every real vLLM boot log kept under tests/data: predicted KV-token range
against what vLLM printed, and the fit verdict against what the boot did, for the estimator of this tree and the
old one (commit 02e0249) side by side.

    python -m benchmarks.estimator_accuracy            # the table and the medians
    python -m benchmarks.estimator_accuracy --json     # one JSON document

Boots, one table per vLLM version: tests/data/gpu-boots/boots.json (vLLM 0.25.0; every entry, cold and warm: new
boots added there are covered), every tests/data/gpu-boots-X/boots.json that benchmarks/h200/boot_matrix.py records
(tests/data/gpu-boots-0.32: vLLM 0.32.0, with whether a full-length request was served), the earlier CUDA logs in
tests/data/gpu/ and the CPU-build logs in tests/data/logs/ that printed a KV-cache size. A warm boot is the target (a
cold one compiled inside vLLM's memory profiling and is shown, never a verdict). A second section,
"published RTX 3090 boots", reads tests/data/rtx3090-boots/records.json: boots published by others on real cards,
with their checkpoint's reconstructed quantization_config (assumptions in that folder's README).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from autotune.fit.estimate import Estimate, estimate
from autotune.fit.hardware import GpuInfo, GpuProfile, cpu_profile, profile_for
from autotune.fit.model_shape import ModelShape
from autotune.fit.vllm_version import MODELLED_VERSIONS, modelled_version
from autotune.fit.weight_bytes import disabled_kernels_in
from benchmarks.catalogue import read_log

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
CONFIG = ROOT / "autotune" / "engine" / "known_models" / "qwen3.5-27b-awq.json"  # the model the device served
OLD_COMMIT = "02e0249"
ARGS = re.compile(r"non-default args: (\{.*\})")
KV_TOKENS = re.compile(r"(?:GPU|CPU) KV cache size: ([0-9,]+) tokens")
VERSION = re.compile(r"Initializing a V1 LLM engine \(v([0-9.]+)\)")
_SERVER_ONLY = {"model", "model_tag", "host", "port", "served_model_name"}


@dataclass(frozen=True)
class Boot:
    """One real boot: what was asked, where, and what vLLM did."""

    name: str
    source: str  # "gpu-boots", "gpu", "cpu"
    flags: dict[str, object]
    model: str  # the folder whose config.json shapes the model
    profile: GpuProfile
    vllm: str
    cache: str  # "cold", "warm", "eager" (no compile), "n/a" (CPU)
    ready: bool  # the server came up
    printed_tokens: int | None  # "KV cache size: N tokens" (printed before a Mamba-block failure too)
    env: Mapping[str, str] = ()  # type: ignore[assignment]
    served: bool | None = None  # a request of the full max_model_len prefilled and decoded (None: not tried)
    figures: Mapping[str, object] = ()  # type: ignore[assignment]  # what its log printed (gpu_boots_table.parse_log)


@dataclass(frozen=True)
class Row:
    boot: Boot
    new: Estimate
    old: Estimate | None

    @property
    def error(self) -> float | None:
        p = self.boot.printed_tokens
        return (self.new.kv_tokens - p) / p if p else None

    @property
    def old_error(self) -> float | None:
        p = self.boot.printed_tokens
        return (self.old.kv_tokens - p) / p if p and self.old is not None else None

    @property
    def inside(self) -> bool:
        p = self.boot.printed_tokens
        return p is not None and self.new.kv_tokens_low <= p <= self.new.kv_tokens_high


def h200() -> GpuProfile:
    info = json.loads((DATA / "gpu" / "h200-idle.json").read_text())["nvml"][0]
    return profile_for(GpuInfo(**{**info, "compute_capability": tuple(info["compute_capability"])}))


def _engine_flags(flags: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in flags.items() if k not in _SERVER_ONLY}


def gpu_boots(folder: Path = DATA / "gpu-boots") -> list[Boot]:
    data = json.loads((folder / "boots.json").read_text())
    if any("vllm_util" in b for b in data["boots"]):
        return matrix_boots(folder)
    profile = h200()
    out = []
    for b in data["boots"]:
        f = b.get("figures", {})
        out.append(Boot(b["name"], "gpu-boots", _engine_flags(b["flags"]), str(CONFIG), profile,
                        str(data.get("vllm", "0.25.0")), b.get("cache", {}).get("state", "warm"),
                        b.get("outcome") == "ready", f.get("kv_cache_tokens"), b.get("env", {}), figures=f))
    return out


def matrix_boots(folder: Path) -> list[Boot]:
    """Boots recorded by benchmarks/h200/boot_matrix.py (boots.json, logs/ and the plan.json beside them): flags in
    vLLM's dashed names, the utilization vLLM was given (vllm_util: the plan's util of a card_mib card, translated to
    the card's NVML total), the vLLM version its boots.json or each log names, and whether a request of the full
    max_model_len prefilled and decoded."""
    data = json.loads((folder / "boots.json").read_text())
    plan = folder / "plan.json"
    card_mib = json.loads(plan.read_text()).get("card_mib", 24576) if plan.exists() else 24576
    version = data.get("vllm") or logged_version(folder / "logs") or folder.name.removeprefix("gpu-boots-")
    out = []
    for b in data["boots"]:
        flags = {k.replace("-", "_"): v for k, v in b["flags"].items()}
        flags |= {"gpu_memory_utilization": b["vllm_util"], "language_model_only": True}
        request = b.get("full_length_request") or {}
        out.append(Boot(b["name"], folder.name, flags, str(CONFIG), device_card(b["util"] * card_mib / b["vllm_util"]),
                        str(version), b.get("cache", "unknown"), b.get("outcome") == "ready",
                        b.get("figures", {}).get("kv_cache_tokens"), served=request.get("ok") if request else None,
                        figures=b.get("figures", {})))
    return out


def logged_version(logs: Path) -> str | None:
    """The vLLM version the first server log in `logs` that names one says it is."""
    for log in sorted(logs.glob("*.log")):
        if m := VERSION.search(log.read_text(errors="replace")):
            return m.group(1)
    return None


def device_card(nvml_total_mib: float) -> GpuProfile:
    """The device's card (an H200 or an H100 80 GB) told by its NVML total, with the H200's measured reserve."""
    from autotune.fit.hardware import PROFILES

    cards = [h200(), PROFILES["h100-80gb"]]
    return min(cards, key=lambda p: abs(p.memory_bytes / 2**20 - nvml_total_mib))


def _log_boot(path: Path, source: str, model: str, profile: GpuProfile) -> Boot | None:
    text = path.read_text(errors="replace")
    args, tokens = ARGS.search(text), KV_TOKENS.search(text)
    if args is None or tokens is None:
        return None
    flags = _engine_flags(ast.literal_eval(args.group(1)))
    version = VERSION.search(text)
    if source == "cpu":
        cache = "n/a"
    elif flags.get("enforce_eager"):
        cache = "eager"
    else:
        cache = "cold" if "Compiling a graph for compile range" in text else "warm"
    ready = "Application startup complete" in text
    return Boot(path.stem, source, flags, model, profile, version.group(1) if version else "?", cache, ready,
                int(tokens.group(1).replace(",", "")))


# vLLM's CPU build says this at boot when the CPU has AVX512-BF16 and the model has GDN layers (platforms/cpu.py)
ACCELERATED_GDN = "Reset SSM cache type to float32 for accelerated GDN"


def recorded_cpu(log: Path) -> GpuProfile:
    """The CPU a log was recorded on, as far as the estimate depends on it: AVX512-BF16 as the log shows it (a
    dense model's log does not, and its estimate does not depend on it), never the CPU replaying it."""
    return cpu_profile(avx512_bf16=ACCELERATED_GDN in log.read_text(errors="replace"))


def log_boots() -> list[Boot]:
    out = [b for p in sorted((DATA / "gpu").glob("cuda-*.log")) if (b := _log_boot(p, "gpu", str(CONFIG), h200()))]
    from autotune.engine.models import tiny_model_dir  # writes the tiny models' config (no weights)

    for p in sorted((DATA / "logs").glob("cpu-*.log")):
        m = ARGS.search(p.read_text(errors="replace"))
        kind = m and ast.literal_eval(m.group(1)).get("model", "").rsplit("/", 1)[-1]
        if kind in ("dense", "hybrid") and (b := _log_boot(p, "cpu", str(tiny_model_dir(kind)), recorded_cpu(p))):
            out.append(b)
    return out


RTX3090 = DATA / "rtx3090-boots"


def rtx3090_boots(folder: Path = RTX3090) -> list[Boot]:
    """The published real-3090 records; each record's model is the shape file with its checkpoint's
    quantization_config merged in (written once to a temporary folder)."""
    from autotune.fit.hardware import PROFILES

    data = json.loads((folder / "records.json").read_text())
    shape = json.loads((ROOT / data["shape"]).read_text())
    tmp = Path(tempfile.mkdtemp(prefix="rtx3090-boots-"))
    out = []
    for r in data["records"]:
        model = tmp / r["name"]
        model.mkdir()
        quant = json.loads((folder / r["quantization_config"]).read_text())
        (model / "config.json").write_text(json.dumps({**shape, "quantization_config": quant}))
        out.append(Boot(r["name"], "rtx3090", r["flags"], str(model), PROFILES[data["card"]],
                        r["vllm"].split()[0], "warm", r["outcome"] == "ready", r.get("printed_tokens"),
                        r.get("env", {})))
    return out


def old_estimator() -> ModuleType | None:
    """autotune/fit/estimate.py as of 02e0249 (before it was fitted to these boots), imported with the modules it
    imported then: that commit's autotune/ unpacked into a temporary folder as the package `old_autotune`."""
    tmp = Path(tempfile.mkdtemp(prefix="old-autotune-"))
    try:
        tar = subprocess.run(["git", "archive", OLD_COMMIT, "autotune"], cwd=ROOT, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar.stdout, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    (tmp / "autotune").rename(tmp / "old_autotune")
    for source in (tmp / "old_autotune").rglob("*.py"):
        source.write_text(re.sub(r"\b(from|import) autotune\b", r"\1 old_autotune", source.read_text()))
    sys.path.insert(0, str(tmp))
    try:
        return importlib.import_module("old_autotune.fit.estimate")
    finally:
        sys.path.remove(str(tmp))


def _shape(model: str) -> ModelShape:
    p = Path(model)
    return ModelShape.from_config(json.loads((p if p.suffix == ".json" else p / "config.json").read_text()))


def predict(boot: Boot, estimator: Callable[..., Estimate] = estimate) -> Estimate:
    kv_space = boot.env.get("VLLM_CPU_KVCACHE_SPACE") if boot.env else None
    return estimator(_shape(boot.model), boot.profile, boot.flags, vllm_version=boot.vllm,
                     cpu_kvcache_bytes=int(float(kv_space) * 2**30) if kv_space else None)


def version_folders() -> list[Path]:
    """Real boots per vLLM version: tests/data/gpu-boots (0.25.0) and every gpu-boots-X folder with a boots.json
    (tests/data/gpu-boots-0.32: 0.32.0)."""
    return [DATA / "gpu-boots"] + sorted(p for p in DATA.glob("gpu-boots-*") if (p / "boots.json").exists())


def fitted_folders() -> list[Path]:
    """The folders a modelled version's constants are fitted on (VERSION_TERMS fitted_on): the boots the estimator
    answers for (benchmarks/tests/test_estimator_accuracy.py); the others are printed, not yet held to it."""
    from autotune.fit.vllm_memory import VERSION_TERMS

    fitted = {ROOT / t.fitted_on for t in VERSION_TERMS.values() if t.fitted_on}
    return [f for f in version_folders() if f in fitted]


def rows(boots: list[Boot] | None = None, with_old: bool = True) -> list[Row]:
    """Each boot with the estimate for it (and the old estimator's); by default the fitted folders' boots and the
    earlier CUDA and CPU logs."""
    boots = [b for f in fitted_folders() for b in gpu_boots(f)] + log_boots() if boots is None else boots
    old = old_estimator() if with_old else None
    return [Row(b, predict(b), old_prediction(b, old)) for b in boots]


def old_prediction(boot: Boot, old: ModuleType | None) -> Estimate | None:
    """The old estimator's prediction; None without it, or where it refuses the flags as input (a KV-cache dtype it
    did not know: the published TurboQuant record)."""
    if old is None:
        return None
    refusal = sys.modules["old_autotune.errors"].SpecError  # imported with the old estimator
    try:
        return predict(boot, old.estimate)
    except refusal:
        return None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def verdict(est: Estimate) -> str:
    return "refused" if est.refused else "fits" if est.fits else "in band"


def old_verdict(est: Estimate | None) -> str:
    return "-" if est is None else "fits" if est.fits else "refused"


def table(rs: list[Row], with_old: bool = True) -> str:
    """One line a boot: configuration, cold or warm, what it did (and whether a full-length request was served:
    'served' / 'died' after 'ready'), the predicted KV-token range and centre, what vLLM printed, the error and the
    verdict before boot; with_old: the old estimator's beside it."""
    head = (f"{'boot':<36} {'vLLM':<6} {'cache':<5} {'outcome':<13} {'predicted range':>19} {'central':>8} "
            f"{'printed':>8} {'error':>7} {'verdict':>8}")
    head += f" | {'old':>8} {'old err':>8} {'old verdict':>11}" if with_old else ""
    lines = [head, "-" * len(head)]
    for r in rs:
        b, e = r.boot, r.new
        rng = f"{e.kv_tokens_low:,}-{e.kv_tokens_high:,}"
        outcome = ("ready" if b.ready else "failed") + {True: " served", False: " died", None: ""}[b.served]
        line = (f"{b.name:<36} {b.vllm[:6]:<6} {b.cache:<5} {outcome:<13} {rng:>19} "
                f"{e.kv_tokens:>8,} {b.printed_tokens or 0:>8,} {_pct(r.error):>7} {verdict(e):>8}")
        if with_old:
            line += f" | {r.old.kv_tokens if r.old else 0:>8,} {_pct(r.old_error):>8} {old_verdict(r.old):>11}"
        lines.append(line)
    return "\n".join(lines)


# (column, the figure its log printed, the Estimate's field)
TERMS = (("weights", "weights_gib", "weights_bytes"),
         ("activation", "torch_peak_increase_gib", "activation_peak_bytes"),
         ("CUDA graphs", "cudagraph_estimate_gib", "cudagraph_bytes"),
         ("KV", "kv_cache_gib", "kv_cache_bytes"))


def terms_table(rs: list[Row]) -> str:
    """Each warm boot's memory terms as its log printed them against the estimate's, GiB (printed/predicted): the
    weights ("Model loading took"), the profile run's torch peak, the CUDA-graph estimate and the KV budget
    ("Available KV cache memory"); where the KV error of the table above comes from."""
    head = f"{'boot':<36} " + " ".join(f"{name:>13}" for name, _, _ in TERMS) + f" {'non-KV left':>11}"
    lines = [head, "-" * len(head)]
    for r in rs:
        if r.boot.cache != "warm" or not r.boot.figures:
            continue
        cells = []
        for _, printed, predicted in TERMS:
            seen = r.boot.figures.get(printed)
            cells.append(f"{'-' if seen is None else f'{seen:.2f}'}/{getattr(r.new, predicted) / 2**30:.2f}")
        kv = r.boot.figures.get("kv_cache_gib")
        rest = "-" if kv is None else f"{kv - r.new.kv_cache_bytes / 2**30:+.2f}"
        lines.append(f"{r.boot.name:<36} " + " ".join(f"{c:>13}" for c in cells) + f" {rest:>11}")
    return "\n".join(lines)


def side_by_side(rs: list[Row], versions: tuple[str, ...] = MODELLED_VERSIONS) -> str:
    """Each warm boot predicted for every modelled version (as `autotune estimate --vllm-version X` would), beside
    what the boot printed: how far another version's model would have been off on it."""
    head = f"{'boot':<36} {'printed':>8} " + " ".join(f"{'as ' + v:>27}" for v in versions)
    lines = [head, "-" * len(head)]
    for r in rs:
        if r.boot.cache != "warm":
            continue
        cells = []
        for v in versions:
            e = predict(dataclasses.replace(r.boot, vllm=v))
            cells.append(f"{e.kv_tokens:,} ({e.kv_tokens_low:,}-{e.kv_tokens_high:,})")
        lines.append(f"{r.boot.name:<36} {r.boot.printed_tokens or 0:>8,} " + " ".join(f"{c:>27}" for c in cells))
    return "\n".join(lines)


def per_version(rs: list[Row]) -> dict[str, list[Row]]:
    """The GPU boots by the vLLM version that ran them (the CPU build's logs left out), oldest first."""
    out: dict[str, list[Row]] = {}
    for r in rs:
        if r.boot.source != "cpu":
            out.setdefault(r.boot.vllm, []).append(r)
    return dict(sorted(out.items(), key=lambda kv: [int(x) for x in re.findall(r"\d+", kv[0])[:3]]))


def version_line(rs: list[Row]) -> str:
    """One version's accuracy: median |KV token error| of its warm boots, how many printed inside the predicted
    range, and which boots that became ready (and served a full-length request, where one was sent) were refused."""
    s = summary(rs)
    served = [r.boot.name for r in rs if r.boot.ready and r.boot.served and r.new.refused]
    return (f"warm boots: {s['warm_gpu_boots']}; median |KV token error| {_pct(s['median_abs_error_warm'])} "  # type: ignore[arg-type]
            f"(max {_pct(s['max_abs_error_warm'])}); printed inside the predicted range: "  # type: ignore[arg-type]
            f"{s['warm_inside_range']}/{s['warm_gpu_boots']}; booted but refused before boot: "
            f"{s['booted_refused'] or 'none'}; of those that served a full-length request: {served or 'none'}")


def summary(rs: list[Row]) -> dict[str, object]:
    warm = [r for r in rs if r.boot.source != "cpu" and r.boot.cache == "warm" and r.error is not None]
    booted = [r for r in rs if r.boot.ready and r.boot.cache != "cold"]
    return {
        "warm_gpu_boots": len(warm),
        "median_abs_error_warm": statistics.median(abs(r.error) for r in warm) if warm else None,  # type: ignore[arg-type]
        "max_abs_error_warm": max(abs(r.error) for r in warm) if warm else None,  # type: ignore[arg-type]
        "old_median_abs_error_warm": (statistics.median(abs(r.old_error) for r in warm if r.old_error is not None)
                                      if warm and all(r.old for r in warm) else None),
        "warm_inside_range": sum(r.inside for r in warm),
        "booted_refused": [r.boot.name for r in booted if r.new.refused],
        "old_booted_refused": [r.boot.name for r in booted if r.old is not None and not r.old.fits],
    }


def published_summary(rs: list[Row]) -> dict[str, object]:
    printed = [r for r in rs if r.error is not None]
    return {
        "records": len(rs),
        "median_error": statistics.median(r.error for r in printed) if printed else None,  # type: ignore[misc]
        "old_median_error": (statistics.median(r.old_error for r in printed if r.old_error is not None)  # type: ignore[misc]
                             if printed and all(r.old for r in printed) else None),
        "inside_range": sum(r.inside for r in printed),
        "with_printed_tokens": len(printed),
        "booted_refused": [r.boot.name for r in rs if r.boot.ready and r.new.refused],
        "old_booted_refused": [r.boot.name for r in rs if r.boot.ready and r.old is not None and not r.old.fits],
    }


SURFACES = ROOT / "benchmarks" / "data"


def predicted_boot(entry: dict, real: str, env: Mapping[str, str] | None = None) -> Estimate:
    """A GPU surface entry's boot (benchmarks/data/*-as-rtx3090-*/surface.json): its flags as they booted, with its
    logical gpu_memory_utilization, judged for the `real` card capped as a 3090 by vLLM 0.25.0 (the device's), in the
    environment its file records (and `env` over it), with the shape of the checkpoint its file served."""
    env = env or {}
    from autotune.fit import feasibility, memcap
    from autotune.fit.hardware import PROFILES
    from benchmarks.h200.run_h200 import AWQ, DEVICE_FLAGS

    flags = {k: v for k, v in entry["flags"].items() if k not in DEVICE_FLAGS}
    flags["gpu_memory_utilization"] = entry["params"].get("gpu_memory_utilization", 0.92)
    profile = memcap.capped_profile(PROFILES[real], memcap.parse_cap("rtx3090"))
    return estimate(feasibility.model_shape(entry.get("_model", AWQ)), profile, flags,
                    vllm_version="0.25.0",
                    disabled_kernels=disabled_kernels_in({**entry.get("_env", {}), **env}))


def surface_boots(name: str, repeats: bool = False) -> list[dict]:
    """A surface file's configurations (and, with `repeats`, each configuration measured again after them), each
    with its plan index and, for a ballast run, the ballast's line."""
    from benchmarks.record_surface import params_key, plan_indices, recorded_env

    doc = json.loads((SURFACES / name).read_text())
    index = plan_indices(doc["provenance"]["plan"])
    return [{**c, "plan_index": index[params_key(c["params"])], "_ballast": doc["provenance"].get("ballast"),
             "_env": recorded_env(doc["provenance"]), "_logs": (SURFACES / name).parent / "logs",
             "_model": doc["provenance"]["model"]}
            for c in doc["configs"] + (doc.get("repeats", []) if repeats else [])]


def warm_sized(name: str) -> list[tuple[dict, Estimate]]:
    """A held-down file's boots that vLLM sized itself on a warm compile cache (no KV blocks given), first
    measurements and repeats alike, with the estimate for each: the boots a long study makes."""
    return [(c, predicted_boot(c, "h100-80gb")) for c in surface_boots(name, repeats=True)
            if c.get("compile_cache") == "warm" and not c.get("kv_blocks_given") and c.get("kv_cache_tokens")]


def warm_sized_line(name: str) -> str:
    """How near the estimate's KV tokens came to what each warm boot of `name` sized (error: predicted / printed)."""
    seen = warm_sized(name)
    if not seen:
        return "warm boots vLLM sized itself: none"
    errors = [e.kv_tokens / c["kv_cache_tokens"] - 1 for c, e in seen]
    inside = sum(e.kv_tokens_low <= c["kv_cache_tokens"] <= e.kv_tokens_high for c, e in seen)
    return (f"warm boots vLLM sized itself (first measurements and repeats): {len(seen)}; median |error| "
            f"{statistics.median(abs(x) for x in errors):.1%}, max {max(abs(x) for x in errors):.1%}; printed inside "
            f"the predicted range: {inside}/{len(seen)}")


# The held-down runs with autotune's own flags: an H100 with a ballast leaving the capped card's CUDA total free.
HELD_DOWN = {
    "h100-as-rtx3090-awq-machete/surface.json": "no capture-size pin on 0.25, AWQ through Machete; 2026-12-05",
    "h100-as-rtx3090-awq-marlin/surface.json": "Machete disabled, AWQ through Marlin as on a 3090; 2026-12-06 to 12-07",
    # planned by benchmarks/surface_plan.py --checkpoint, recorded 2026-12-06
    "h100-as-rtx3090-gptq-marlin/surface.json": "Machete disabled, GPTQ-Int4 through Marlin as on a 3090; 2026-12-06",
}


def boot_peaks() -> str:
    """The boot's peak outside the budget (fit/vllm_memory.py profiling_blocks), predicted against what the device
    saw: NVML's peak while booting on the H200 capped as a 3090, the ballast run's failures
    (h100-as-rtx3090-awq-capture-pinned) and the held-down runs' boots with autotune's own flags (HELD_DOWN)."""
    lines = ["boot peaks on the capped H200 (NVML while booting; benchmarks/data/h200-as-rtx3090-awq/surface.json)",
             f"{'seqs':>5} {'spec':>5} {'capture':>8} {'seen GiB':>9} {'predicted':>10} {'error':>7}"]
    errors = []
    for c in surface_boots("h200-as-rtx3090-awq/surface.json"):
        seen = c.get("boot_peak_memory_gib") or 0
        if seen <= 1:
            continue
        e = predicted_boot(c, "h200")
        errors.append(e.boot_peak_bytes / 2**30 - seen)
        lines.append(f"{c['params']['max_num_seqs']:>5} {c['params'].get('speculative_method', 'none'):>5} "
                     f"{c['flags'].get('max_cudagraph_capture_size', '-'):>8} {seen:>9.2f} "
                     f"{e.boot_peak_bytes / 2**30:>10.2f} {errors[-1]:>+7.2f}")
    lines.append(f"{len(errors)} boots: median |error| {statistics.median(abs(x) for x in errors):.2f} GiB, max "
                 f"{max(abs(x) for x in errors):.2f}")
    lines.append("\nthe ballast run (an H100 held down to the 3090's CUDA total; "
                 "h100-as-rtx3090-awq-capture-pinned/surface.json)")
    for c in surface_boots("h100-as-rtx3090-awq-capture-pinned/surface.json"):
        e = predicted_boot(c, "h100-80gb")
        asked = re.search(r"Tried to allocate ([\d.]+) GiB", c.get("reason", ""))
        lines.append(f"  max_num_seqs {c['params']['max_num_seqs']}: {c['status']} "
                     f"({asked.group(0) if asked else '-'}); predicted boot peak {e.boot_peak_bytes / 2**30:.2f} GiB, "
                     f"{'refused' if e.refused else 'booted'} before boot")
    for name, what in ((n, w) for n, w in HELD_DOWN.items() if (SURFACES / n).exists()):
        lines.append(f"\nthe ballast run with autotune's own flags ({what}, {name}): process GiB = NVML less what the "
                     "ballast held; a failed boot's held + asked is CUDA's message (the last log's), the process's "
                     "need where it failed")
        lines.extend(held_down_rows(name))
        lines.append(warm_sized_line(name))
    return "\n".join(lines)


def held_down_rows(name: str) -> list[str]:
    """One held-down file's boots: the estimator's verdict and peak against what each boot did and held."""
    lines = [f"{'#':>3} {'seqs':>5} {'mtp':>3} {'verdict':>8} {'boot':>5} {'status':>11} {'asked':>9} "
             f"{'held+asked':>10} {'predicted':>10} {'booting':>8} {'ready':>6}  KV blocks (vLLM's own: as it "
             "sized them)"]
    for c in surface_boots(name):
        e, held = predicted_boot(c, "h100-80gb"), ballast_held_gib(c)
        failed = failed_allocations(c)
        seen = [f"{v - held:.2f}" if v else "-" for v in (c.get("boot_peak_memory_gib"), c.get("ready_memory_gib"))]
        if c.get("kv_blocks_given"):
            blocks = f"given {c['kv_blocks_given']}, own {c['kv_blocks_profiled']}"
        elif c.get("kv_cache_tokens"):
            blocks = f"own {round(c['kv_cache_tokens'] * e.num_blocks / e.kv_tokens)}"
        else:
            blocks = "-"
        blocks += f" (est. {e.num_blocks})"
        asked, need = (f"{failed[-1][1]:.2f}", f"{failed[-1][1] + failed[-1][2]:.2f}") if failed else ("-", "-")
        mtp = c["params"].get("num_speculative_tokens") if c["params"].get("speculative_method") == "mtp" else "-"
        lines.append(f"{c['plan_index']:>3} {c['params']['max_num_seqs']:>5} {mtp:>3} {verdict(e):>8} "
                     f"{c['compile_cache'] or '-':>5} {c['status']:>11} {asked:>9} {need:>10} "
                     f"{e.boot_peak_bytes / 2**30:>10.2f} {seen[0]:>8} {seen[1]:>6}  {blocks}")
    return lines


def boot_logs(entry: dict) -> list[Path]:
    """A held-down configuration's server logs, kept beside its surface file in a folder per recording run (named
    by its first log line's time, so sorted in time), each run's cold boot (NN.cold.log.gz) before the boot that
    followed it (NN.log.gz)."""
    return sorted(entry["_logs"].glob(f"*/{entry['plan_index']:02d}*.log.gz"))


def failed_allocations(entry: dict) -> list[tuple[str, float, float]]:
    """(log, GiB asked, GiB the process held) for each of a held-down boot's logs that ran out of memory, from
    CUDA's own message in the server logs kept beside the surface file (its reason is cut short)."""
    out = []
    for log in boot_logs(entry):
        m = re.search(r"Tried to allocate ([\d.]+) ([GM]iB).*?this process has ([\d.]+) GiB memory in use",
                      read_log(log))
        if m:
            out.append((log.name, float(m.group(1)) / (1 if m.group(2) == "GiB" else 1024), float(m.group(3))))
    return out


def ballast_held_gib(entry: dict) -> float:
    """What the card held besides the server during a ballast run (the ballast and its CUDA context), from the
    line it printed: 'CUDA free F of T GiB'. 0 for a surface recorded without one."""
    doc = entry.get("_ballast") or ""
    m = re.search(r"CUDA free ([\d.]+) of ([\d.]+) GiB", doc)
    return float(m.group(2)) - float(m.group(1)) if m else 0.0


def main(argv: list[str]) -> int:
    rs = rows([b for f in version_folders() for b in gpu_boots(f)] + log_boots())
    s = summary(rs)
    pub = rows(rtx3090_boots())
    if "--json" in argv:
        print(json.dumps({"rows": [{"boot": r.boot.name, "source": r.boot.source, "vllm": r.boot.vllm,
                                    "cache": r.boot.cache, "ready": r.boot.ready, "printed": r.boot.printed_tokens,
                                    "predicted": r.new.kv_tokens, "low": r.new.kv_tokens_low,
                                    "high": r.new.kv_tokens_high, "verdict": verdict(r.new),
                                    "old_predicted": r.old.kv_tokens if r.old else None} for r in rs + pub],
                          "summary": s, "published_rtx3090": published_summary(pub)}, indent=1))
        return 0
    for version, group in per_version(rs).items():
        print(f"vLLM {version} (modelled as {modelled_version(version).label})")
        print(table(group, with_old=version == "0.25.0"))
        print(version_line(group))
        print("\nits memory terms, printed/predicted GiB (non-KV left: printed KV less predicted)")
        print(terms_table(group))
        print("\nits warm boots predicted for each modelled version (KV tokens, central and range)")
        print(side_by_side(group))
        print()
    print("all boots, the CPU build's logs included")
    med, old_med = s["median_abs_error_warm"], s["old_median_abs_error_warm"]
    print(f"warm GPU boots: {s['warm_gpu_boots']}; median |error| new {_pct(med)} "  # type: ignore[arg-type]
          f"(max {_pct(s['max_abs_error_warm'])}), old {_pct(old_med)}; "  # type: ignore[arg-type]
          f"printed inside the predicted range: {s['warm_inside_range']}/{s['warm_gpu_boots']}")
    print(f"booted (not cold) but refused before boot: new {s['booted_refused'] or 'none'}; "
          f"old {s['old_booted_refused'] or 'none'}")
    p = published_summary(pub)
    print("\npublished RTX 3090 boots (tests/data/rtx3090-boots/README.md)")
    print(table(pub))
    print(f"\nrecords: {p['records']}; with printed KV tokens: {p['with_printed_tokens']}; median error new "
          f"{_pct(p['median_error'])}, old {_pct(p['old_median_error'])}; "  # type: ignore[arg-type]
          f"printed inside the predicted range: {p['inside_range']}/{p['with_printed_tokens']}")
    print(f"booted but refused before boot: new {p['booted_refused'] or 'none'}; "
          f"old {p['old_booted_refused'] or 'none'}")
    print()
    print(boot_peaks())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

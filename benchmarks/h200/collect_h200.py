"""Turn what run_h200.sh brought back from the device into benchmarks/data/h200-cuda-boots/results.json (and the
captured test data under tests/data/gpu).

    python -m benchmarks.h200.collect_h200 DIR...   # folders holding trials.tgz / study.tgz / g3.tgz, unpacked

For every booted configuration it sets the estimator's prediction (for the H200 capped to 24 GiB, vLLM 0.25.0:
before this run's fixes, read from git, and now) against what vLLM printed, and the NVML peak against nvidia-smi
over the same window. Figures that the logs of the study's own trials would have printed (their logs stayed on
the device) are derived from what the study recorded: vLLM's "GPU KV cache size" in tokens gives the block count.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune.engine.logs import classify_log, parse_boot_info
from autotune.fit import memcap
from autotune.fit.estimate import estimate
from autotune.fit.hardware import GpuInfo, profile_for
from autotune.fit.model_shape import ModelShape
from autotune.units import GiB

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "data" / "h200-cuda-boots/results.json"
CONFIG = ROOT / "autotune" / "engine" / "known_models" / "qwen3.5-27b-awq.json"  # the model run_h200.py served
FIXED = {"load_format": "dummy", "language_model_only": True, "skip_tokenizer_init": True,
         "gdn_prefill_backend": "triton"}
BEFORE_COMMIT = "bd557e6"  # the estimator as it was when the device run was made
NOTES = [
    "The run used a copy of the tree (.gpusnap) with a patch that made autotune/study.py apply memory_cap_gib "
    "(the study applies it itself now).",
    "NVML v1 'used' (what hardware.read_nvml and so peak_memory_gib record) includes the driver's reserve "
    "(615 MiB on the H200); nvidia-smi's memory.used equals NVML v2 'used', which excludes it.",
    "vLLM 0.25 reported 17.21 GiB of weights where the estimator counted 16.52 GiB: AWQ runs through Machete on "
    "Hopper (16-bit zero points); the estimator now charges 6.5 bytes per group of 128 there (fitted).",
    "A boot with torch.compile + CUDA graphs took ~2.9-3.1 GiB beside the weights (eager: 0.67 GiB at 2048 batched "
    "tokens, 1.52 at 8192); the old estimator charged 0.06-0.1 GiB for graphs and so predicted that "
    "max_num_seqs 32 / 8192 tokens / 8192 context fits with CUDA graphs, which vLLM refused (30 Mamba blocks). "
    "Now a compiled boot's activation peak has a floor of 44 MiB per layer.",
    "vLLM 0.25 keeps prefix caching off for hybrid models (one state block per GDN group per request); the "
    "estimator assumed it on (two); now a vllm_version argument decides.",
    "Eager decode of this shape on the H200 is slow (p95 TPOT 87-125 ms vs 11-17 ms with CUDA graphs): the H200's "
    "eager throughput says nothing about the 3090's.",
    "The first boot on a fresh machine took 192 s eager (Triton JIT of the GDN kernels in the profile run); later "
    "eager boots 51-55 s; CUDA-graph boots 213-218 s (torch.compile 54 s, profiling/warm-up 94 s).",
    "The study's server logs stayed on the device (studies write them beside the study file, not under GPURUN).",
]
_AVAIL = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_GRAPH_EST = re.compile(r"Estimated CUDA graph memory: ([\d.]+) GiB")
_MAMBA = re.compile(r"exceeds available Mamba cache blocks \((\d+)\)")


def old_estimator():
    """estimate.py as committed at BEFORE_COMMIT, imported under another name."""
    src = subprocess.run(["git", "show", f"{BEFORE_COMMIT}:autotune/estimate.py"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "estimate_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("estimate_before", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["estimate_before"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def series(folder: Path, tag: str) -> tuple[list[dict], list[tuple[float, int]]]:
    nvml = [json.loads(line) for line in (folder / f"nvml-{tag}.jsonl").read_text().splitlines() if line]
    smi = []
    for line in (folder / f"smi-{tag}.csv").read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            smi.append((t, int(parts[2])))
        except (ValueError, IndexError):
            continue
    return nvml, smi


def peaks(nvml: list[dict], smi: list[tuple[float, int]], t0: float, t1: float) -> dict[str, float]:
    w = [r for r in nvml if t0 <= r["t"] <= t1]
    s = [used for t, used in smi if t0 <= t <= t1]
    return {
        "nvml_v1_used_peak_gib": round(max(r["v1_used"] for r in w) / GiB, 3),
        "nvml_v2_used_peak_gib": round(max(r["v2_used"] for r in w) / GiB, 3),
        "nvml_process_peak_gib": round(max(sum(p[1] or 0 for p in r.get("procs", [])) for r in w) / GiB, 3),
        "nvidia_smi_used_peak_gib": round(max(s) / 1024, 3),
        "nvml_driver_reserved_gib": round(w[0]["v2_reserved"] / GiB, 3),
        "samples_nvml": len(w), "samples_smi": len(s),
    }


def predicted(est) -> dict[str, object]:
    return {"weights_gib": round(est.weights_bytes / GiB, 2), "kv_cache_gib": round(est.kv_cache_bytes / GiB, 2),
            "num_blocks": est.num_blocks, "kv_tokens": est.kv_tokens, "fits": est.fits, "reasons": list(est.reasons)}


def main(folders: list[Path]) -> None:
    raw: dict = {}
    where: dict[str, Path] = {}
    for folder in folders:
        for key, value in json.loads((folder / "results-raw.json").read_text()).items():
            raw[key] = value
            where[key] = folder
    idle = raw["idle"]
    info = GpuInfo(**{**idle["nvml"][0], "compute_capability": tuple(idle["nvml"][0]["compute_capability"])})
    real = profile_for(info)
    cap = memcap.parse_cap(24)
    capped = memcap.capped_profile(real, cap)
    config = json.loads(CONFIG.read_text())
    shape = ModelShape.from_config(config)
    before = old_estimator()
    before_shape = before.ModelShape.from_config(config)
    cuda_total_torch = int(idle["cuda_mem_get_info"].split()[1])

    # (name, logical flags, source): every configuration vLLM booted (or tried to) under the cap
    configs = [
        ("eager 16 seqs b2048 L4096", {**FIXED, "enforce_eager": True, "max_num_seqs": 16,
                                   "max_num_batched_tokens": 2048, "max_model_len": 4096}, "trial:eager-s16-b2048"),
        ("eager 32 seqs b8192 L8192", {**FIXED, "enforce_eager": True, "max_num_seqs": 32,
                                   "max_num_batched_tokens": 8192, "max_model_len": 8192}, "trial:eager-s32-b8192"),
        ("vLLM defaults (eager) L262144", {**FIXED, "enforce_eager": True}, "cli_defaults"),
        ("CUDA graphs 16 seqs b2048 L4096 (study trial 1)", {**FIXED, "enforce_eager": False, "max_num_seqs": 16,
                                                        "max_num_batched_tokens": 2048, "max_model_len": 4096},
         "study:1"),
        ("eager 9 seqs b8192 L4096 (study trial 2)", {**FIXED, "enforce_eager": True, "max_num_seqs": 9,
                                                 "max_num_batched_tokens": 8192, "max_model_len": 4096}, "study:2"),
        ("CUDA graphs 32 seqs b8192 L8192", {**FIXED, "enforce_eager": False, "max_num_seqs": 32,
                                         "max_num_batched_tokens": 8192, "max_model_len": 8192},
         "trial:graphs-s32-b8192"),
    ]
    study_trials = {t["number"]: t for t in raw["study"]["trials"]}
    rows = []
    for name, flags, source in configs:
        obs: dict[str, object] = {}
        window = None
        if source.startswith("study:"):
            t = study_trials[int(source.split(":")[1])]
            a = t["user_attrs"]
            obs.update(weights_gib=a.get("weights_gib"), kv_tokens=a.get("kv_cache_tokens"), booted=True,
                       boot_s=a.get("boot_s"), log="stayed on the device (study artifacts)")
            window = (t["start"], t["end"], "study")
        else:
            entry = raw[source]
            log_name = Path(entry.get("log") or f"cuda-{source.split(':', 1)[1]}.log").name
            lines = (where[source] / log_name).read_text().splitlines()
            boot = parse_boot_info(lines, 0.0)
            failure = classify_log(lines, exited=True) if source == "cli_defaults" or "graphs-s32" in source else None
            avail = [float(m.group(1)) for line in lines if (m := _AVAIL.search(line))]
            graph = [float(m.group(1)) for line in lines if (m := _GRAPH_EST.search(line))]
            mamba = [int(m.group(1)) for line in lines if (m := _MAMBA.search(line))]
            obs.update(weights_gib=boot.weights_gib, kv_tokens=boot.kv_cache_tokens,
                       available_kv_gib=avail[0] if avail else None,
                       vllm_cudagraph_estimate_gib=graph[0] if graph else None,
                       mamba_blocks=mamba[0] if mamba else None, booted=failure is None,
                       failure=None if failure is None else {"kind": failure.kind.value, "reason": failure.reason},
                       log=log_name)
            tag = "trials" if source in ("cli_defaults", "trial:eager-s16-b2048", "trial:eager-s32-b8192") \
                else "graphs2"
            window = (entry["t0"], entry["t1"], tag)
        engine_flags = memcap.engine_flags(flags, cap, real)
        now = estimate(shape, capped, flags, vllm_version="0.25.0")
        old = before.estimate(before_shape, capped, flags)
        if obs.get("kv_tokens"):  # the pool's blocks, from vLLM's token count and the per-request block count
            per_request = now.blocks_per_request
            obs["num_blocks"] = round(obs["kv_tokens"] / flags["max_model_len"] * per_request)
        row = {"name": name, "flags": flags, "engine_flags": engine_flags, "observed": obs,
               "predicted_before": predicted(old), "predicted_now": predicted(now)}
        if window is not None:
            folder = where["study"] if window[2] == "study" else where.get(source, folders[0])
            nvml, smi = series(folder, window[2])
            row["memory"] = peaks(nvml, smi, window[0], window[1])
        rows.append(row)

    trials = []
    for key in ("trial:eager-s16-b2048", "trial:eager-s32-b8192"):
        r = raw[key]["result"]
        trials.append({"name": key.split(":")[1],
                       "via": "autotune.measure.trial.run_trial (the path of `autotune trial`)",
                       "status": r["status"], "output_tok_s": r["output_tok_s"], "boot_s": r["boot_s"],
                       "reason": r.get("reason"), "objective": "tests/data/gpu/smoke-objective.toml with its first "
                       "limits (p95 TTFT <= 1 s, p95 TPOT <= 50 ms)", "levels": r["levels"]})
    for number in (1, 2):
        a = study_trials[number]["user_attrs"]
        trials.append({"name": f"study trial {number}", "via": "autotune run (smoke-study.toml, --gpus 0)",
                       "status": a["status"], "output_tok_s": a["output_tok_s"], "best_level": a.get("best_level"),
                       "ttft_p95_ms": a.get("ttft_p95_ms"), "tpot_p95_ms": a.get("tpot_p95_ms"),
                       "boot_s": a.get("boot_s"), "peak_memory_gib_as_recorded": a.get("peak_memory_gib"),
                       "objective": "smoke-objective.toml as committed (p95 TTFT <= 3 s, p95 TPOT <= 150 ms; "
                       "loosened on the device after eager TPOT was 87-111 ms)", "levels": a["levels"]})

    study = raw["study"]
    out = {
        "issue": 8,
        "provenance": {
            "device": "one NVIDIA H200 (lent 'nvidia-h200' machine), " + idle["nvidia_smi"].splitlines()[1],
            "driver": "580.159.04", "cuda_runtime": "13.0 (torch 2.11.0+cu130 of the device image)",
            "vllm": idle["vllm_version"] + " (CUDA build, wheels from benchmarks/h200/fetch-wheels.sh)",
            "python": idle["python"], "date": "2026-12-02",
            "model": "Qwen3.5-27B shape (a folder holding autotune/engine/known_models/qwen3.5-27b-awq.json as its "
                     "config.json): Qwen3_5ForConditionalGeneration, 64 layers "
                     "(48 Gated DeltaNet + 16 full attention), AWQ 4-bit g128 config, random weights "
                     "(--load-format dummy), text only (--language-model-only), --skip-tokenizer-init, "
                     "--gdn-prefill-backend triton, VLLM_USE_FLASHINFER_SAMPLER=0",
            "memory_cap": memcap.describe(real, cap),
            "script": "benchmarks/h200/run_h200.sh (phases trials, study) + run_h200.py; this file by collect_h200.py",
            "device_time_s": 1233, "estimator_before": f"git {BEFORE_COMMIT}:autotune/estimate.py",
        },
        "idle_card": {"nvml_total_bytes": info.total_bytes, "nvml_reserved_bytes": info.reserved_bytes,
                      "nvml_v1_used_bytes": info.used_bytes, "cuda_total_bytes_torch": cuda_total_torch,
                      "profile_cuda_total_bytes": real.cuda_total_bytes,
                      "nvidia_smi": idle["nvidia_smi"].strip()},
        "memcap": {"cap_total_bytes": cap.total_bytes, "cap_cuda_total_bytes": cap.cuda_total_bytes,
                   "requested_utilization": 0.92,
                   "engine_gpu_memory_utilization": memcap.cap_utilization(real, cap, 0.92),
                   "reserved_bytes": memcap.reserved_bytes(cap.cuda_total_bytes, 0.92),
                   "reserved_bytes_on_h200": math.ceil(cuda_total_torch * memcap.cap_utilization(real, cap, 0.92)),
                   "pinned_defaults": "max_num_seqs 256, max_num_batched_tokens 2048 (vLLM's for cards < 70 GiB; "
                                      "the H200's own would be 1024 and 8192)"},
        "notes": NOTES,
        "configurations": rows,
        "trials": trials,
        "study": {"command": "autotune run tests/data/gpu/smoke-study.toml --n-trials 2 --budget 9m --gpus 0",
                  "rc": study["steps"]["run"]["rc"], "wall_s": round(study["t1"] - study["t0"], 1),
                  "trials": [{"number": t["number"], "state": t["state"], "value": t["value"],
                              "constraints": t["constraints"], "status": t["user_attrs"].get("status"),
                              "reason": t["user_attrs"].get("reason")} for t in study["trials"]],
                  "export_flags": study["steps"]["export"]["stdout"].strip(),
                  "export_yaml": study["steps"]["export_yaml"]["stdout"]},
    }
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    for row in rows:
        o, b, n = row["observed"], row["predicted_before"], row["predicted_now"]
        print(f"{row['name']:46} weights {o.get('weights_gib')} | {b['weights_gib']} -> {n['weights_gib']}   "
              f"tokens {o.get('kv_tokens')} | {b['kv_tokens']} -> {n['kv_tokens']}   blocks {o.get('num_blocks')} | "
              f"{b['num_blocks']} -> {n['num_blocks']}   fits {o.get('booted')} | {b['fits']} -> {n['fits']}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        raise SystemExit(__doc__)
    main([Path(a) for a in sys.argv[1:]])

"""The H200 device run: autotune against CUDA vLLM on one H200 capped to behave as a 24 GiB card.

Run on the device by run_h200.sh, from the repository root, after vLLM 0.25.0 is installed into /tmp/site
(benchmarks/h200/run_h200.sh's header has the whole runbook):

    python3 -m benchmarks.h200.run_h200 idle     # NVML, nvidia-smi and CUDA's view of the idle card
    python3 -m benchmarks.h200.run_h200 trials   # `autotune trial` of vLLM's defaults (must fail), two eager trials
    python3 -m benchmarks.h200.run_h200 study    # `autotune run` of tests/data/gpu/smoke-study.toml (2 booted
                                                 # trials), status, export
    python3 -m benchmarks.h200.run_h200 chat     # `autotune run` of tests/data/gpu/chat-as-3090.toml for what is
                                                 # left of the call (resumes its study: run it once per call)

The model is the Qwen3.5-27B AWQ shape autotune ships (autotune/engine/known_models/qwen3.5-27b-awq.json): every phase
first writes it as a model folder (that file as its config.json; the weights are random, --load-format dummy)
under WORK, and the study phase gives `autotune run` a copy of the study file whose [model] path points there.
Every phase samples NVML (its own raw series, beside the trial's MemorySampler) and nvidia-smi in the background,
and appends what it measured to WORK/results-raw.json, so a phase killed at the device's time limit still leaves
its finished steps. collect_h200.py (on the workstation) turns the raw files into
benchmarks/data/h200-cuda-boots/results.json.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "gpu"
WORK = Path(os.environ.get("GPURUN", "/tmp/gpurun"))
AWQ = "QuantTrio/Qwen3.5-27B-AWQ"
CONFIG = ROOT / "autotune" / "engine" / "known_models" / "qwen3.5-27b-awq.json"  # shipped for AWQ
MODEL = WORK / "qwen3.5-27b-awq-dummy"  # written by write_model(): CONFIG as its config.json, no weights
OBJECTIVE = DATA / "smoke-objective.toml"
STUDY = DATA / "smoke-study.toml"
PY = sys.executable
# What every boot of MODEL on the device needs beyond a study's flags: random weights (no tokenizer either: the
# load generator sends token ids) and Triton's Gated DeltaNet prefill, FlashInfer not being carried.
DEVICE_FLAGS = {"load_format": "dummy", "skip_tokenizer_init": True, "gdn_prefill_backend": "triton"}
FIXED = {**DEVICE_FLAGS, "language_model_only": True, "max_model_len": 4096}
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
TRIALS = {  # booted by the library (the same path `autotune trial` takes), each capped to 24 GiB
    "eager-s16-b2048": {**FIXED, "enforce_eager": True, "max_num_seqs": 16, "max_num_batched_tokens": 2048},
    "eager-s32-b8192": {**FIXED, "enforce_eager": True, "max_num_seqs": 32, "max_num_batched_tokens": 8192,
                        "max_model_len": 8192},
}


def write_model() -> None:
    """The model folder vLLM serves (with --load-format dummy): the shipped config as config.json."""
    model_folder(AWQ)


def served_model(hub_id: str, work: Path = WORK) -> Path:
    """Where the device serves a shipped checkpoint's shape from (model_folder writes it); MODEL for AWQ."""
    from autotune.engine.models import KNOWN

    if hub_id not in KNOWN:
        raise SystemExit(f"{hub_id}: no shipped config (autotune/engine/known_models): {', '.join(KNOWN)}")
    return work / f"{Path(KNOWN[hub_id]).stem}-dummy"


def model_folder(hub_id: str, work: Path = WORK) -> Path:
    """The folder vLLM serves a shipped checkpoint's shape from (random weights): its known config as config.json."""
    from autotune.engine.models import KNOWN, KNOWN_MODELS

    folder = served_model(hub_id, work)
    folder.mkdir(parents=True, exist_ok=True)
    shipped = (KNOWN_MODELS / KNOWN[hub_id]).read_text()
    config = json.loads(shipped)
    gptq = config.get("quantization_config") or {}
    if gptq.get("quant_method") == "gptq" and not gptq.get("modules_in_block_to_quantize"):
        # vLLM reads which layers a GPTQ checkpoint quantized from its safetensors headers; random weights have
        # none, so name them, as the checkpoint's headers do (h100-as-rtx3090-gptq-marlin-config-only served this config
        # without: all bf16)
        gptq["modules_in_block_to_quantize"] = gptq_quantized_modules(config)
        shipped = json.dumps(config, indent=1)
    (folder / "config.json").write_text(shipped)
    return folder


def gptq_quantized_modules(config: dict) -> list[str]:
    """The linear layers a GPTQ config quantizes, by their checkpoint names (what vLLM derives from the headers)."""
    from autotune.fit.model_shape import ModelShape

    shape = ModelShape.from_config(config)
    return [m.name for m in shape.modules
            if m.kind == "linear" and m.part == "text" and shape.quantization.scheme(m.name) is not None]


def study_file(study: Path = STUDY) -> Path:
    """A copy of a device study (and its objective) under WORK whose [model] path is the folder write_model made."""
    text = study.read_text()
    hub_id = 'path = "QuantTrio/Qwen3.5-27B-AWQ"'
    if hub_id not in text:
        raise SystemExit(f"{STUDY}: expected the line {hub_id!r} in [model]")
    # the objective by an absolute path: the copy under WORK has no objective beside it
    text = re.sub(r'^objective = "([^"]+)"',
                  lambda m: f'objective = {json.dumps(str((study.parent / m[1]).resolve()))}', text, flags=re.M)
    copy = WORK / study.name
    copy.write_text(text.replace(hub_id, f"path = {json.dumps(str(MODEL))}"))
    return copy


def record(key: str, value: object) -> None:
    path = WORK / "results-raw.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1, default=str))


class Samplers:
    """NVML every 0.2 s (v1 used, v2 used/reserved, per-process) and nvidia-smi every 0.2 s, to files."""

    def __init__(self, tag: str):
        import pynvml

        self.pynvml, self.tag, self.stop_event = pynvml, tag, threading.Event()
        self.nvml_path = WORK / f"nvml-{tag}.jsonl"
        self.smi_path = WORK / f"smi-{tag}.csv"
        self.smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,memory.total,memory.used,memory.free",
             "--format=csv,noheader,nounits", "-lms", "200"], stdout=open(self.smi_path, "w"), stderr=subprocess.STDOUT)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        nv = self.pynvml
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        with open(self.nvml_path, "w") as f:
            while not self.stop_event.wait(0.2):
                v1 = nv.nvmlDeviceGetMemoryInfo(h)
                row = {"t": time.time(), "v1_used": int(v1.used), "v1_total": int(v1.total)}
                try:
                    v2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                    row.update(v2_used=int(v2.used), v2_reserved=int(v2.reserved), v2_free=int(v2.free))
                except nv.NVMLError as e:
                    row["v2_error"] = str(e)
                try:
                    row["procs"] = [[p.pid, p.usedGpuMemory] for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
                except nv.NVMLError as e:
                    row["procs_error"] = str(e)
                f.write(json.dumps(row) + "\n")
                f.flush()
        nv.nvmlShutdown()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)
        self.smi.terminate()
        self.smi.wait(timeout=5)


def idle() -> None:
    """The idle card as NVML, nvidia-smi and CUDA (torch) see it: the facts a memory cap is computed from."""
    from autotune.fit.hardware import detect_gpus, profile_for

    gpus = detect_gpus()
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.reserved,memory.used,"
                          "memory.free", "--format=csv"], capture_output=True, text=True).stdout
    cuda = subprocess.run([PY, "-c", "import torch; f, t = torch.cuda.mem_get_info(); "
                           "p = torch.cuda.get_device_properties(0); print(f, t, p.total_memory, p.name)"],
                          capture_output=True, text=True)
    import vllm

    record("idle", {"nvml": [vars(g) for g in gpus], "profile": vars(profile_for(gpus[0])) if gpus else None,
                    "nvidia_smi": smi, "cuda_mem_get_info": cuda.stdout.strip() or cuda.stderr[-2000:],
                    "vllm_version": vllm.__version__, "python": sys.version.split()[0],
                    "nvidia_smi_full": subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout})
    print(smi, cuda.stdout)


def cli_defaults_trial() -> None:
    """`autotune trial --memory-cap 24` with vLLM's defaults (eager to spare the compile): must fail, classified."""
    log = WORK / "cuda-defaults-capped.log"
    argv = [PY, "-m", "autotune.cli", "trial", "--model", str(MODEL), "--objective", str(OBJECTIVE), "--gpu", "0",
            "--memory-cap", "24", "--log", str(log), "--boot-timeout", "5m",
            *[a for k, v in {"load_format": "dummy", "language_model_only": "true", "skip_tokenizer_init": "true",
                             "gdn_prefill_backend": "triton", "enforce_eager": "true"}.items()
              for a in ("--set", f"{k}={v}")], "--env", "VLLM_USE_FLASHINFER_SAMPLER=0"]
    t0 = time.time()
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=330)
    record("cli_defaults", {"argv": argv, "rc": out.returncode, "stdout": out.stdout[-6000:],
                            "stderr": out.stderr[-3000:], "t0": t0, "t1": time.time(), "log": str(log)})
    print(out.stdout[-3000:], out.stderr[-2000:])


def library_trial(name: str, flags: dict[str, object]) -> None:
    from autotune.config.objective import load_objective
    from autotune.engine.models import model_vocab_size
    from autotune.engine.server import EngineSpec
    from autotune.fit import memcap
    from autotune.measure.plan import TrialPlan
    from autotune.measure.trial import run_trial

    real = memcap.present_gpu(0)
    cap = memcap.parse_cap(24)
    engine_flags = memcap.engine_flags(flags, cap, real)
    objective = load_objective(OBJECTIVE)
    log = WORK / f"cuda-{name}.log"
    plan = TrialPlan(EngineSpec(str(MODEL), engine_flags, ENV, boot_timeout_s=360), objective,
                     model_vocab_size(str(MODEL)), log, (0,))
    t0 = time.time()
    result = run_trial(plan, on_stage=lambda s: print(f"[{time.time() - t0:6.1f}s] {name}: {s}", flush=True))
    from autotune.search.record import result_attrs

    attrs = result_attrs(result)
    attrs["memory"] = vars(result.memory) if result.memory else None
    attrs["boot"] = vars(result.boot) if result.boot else None
    record(f"trial:{name}", {"flags": flags, "engine_flags": engine_flags, "t0": t0, "t1": time.time(),
                             "result": attrs})
    print(json.dumps({k: attrs.get(k) for k in ("status", "output_tok_s", "best_level", "ttft_p95_ms",
                                                 "tpot_p95_ms", "kv_cache_tokens", "weights_gib", "boot_s",
                                                 "peak_memory_gib", "reason")}), flush=True)


def study() -> None:
    db = WORK / "smoke-study.db"
    url = f"sqlite:///{db}"
    t0 = time.time()
    run = subprocess.run([PY, "-m", "autotune.cli", "run", str(study_file()), "--n-trials", "2", "--budget", "9m",
                          "--gpus", "0", "--storage", url], capture_output=True, text=True, cwd=ROOT, timeout=560)
    t1 = time.time()
    steps = {"run": {"rc": run.returncode, "stdout": run.stdout[-8000:], "stderr": run.stderr[-4000:]}}
    for name, args in (("status", ["status"]), ("export", ["export", "--format", "flags"]),
                       ("export_yaml", ["export", "--format", "yaml"])):
        out = subprocess.run([PY, "-m", "autotune.cli", *args, "--study", "h200-as-24gib-smoke", "--storage", url],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
        steps[name] = {"rc": out.returncode, "stdout": out.stdout[-6000:], "stderr": out.stderr[-2000:]}
    import optuna

    s = optuna.load_study(study_name="h200-as-24gib-smoke", storage=url)
    trials = [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
               "constraints": getattr(t, "constraints", None), "user_attrs": t.user_attrs,
               "start": t.datetime_start.timestamp() if t.datetime_start else None,
               "end": t.datetime_complete.timestamp() if t.datetime_complete else None} for t in s.trials]
    record("study", {"t0": t0, "t1": t1, "steps": steps, "trials": trials})
    print(run.stdout[-4000:], run.stderr[-2000:], steps["export"]["stdout"])


CHAT = DATA / "chat-as-3090.toml"


def chat(seconds: float, until_s: float | None = None) -> None:
    """`autotune run` of the chat study until `seconds` are spent, then (`until_s`: seconds from now) `autotune
    compare` with what is left of them, then status and export. The study lives in WORK/chat.db (carry it back in
    from an earlier session as CHAT_DB to resume it there). CHAT_FROM names an earlier chat study's database in
    the tree (e.g. benchmarks/data/h200-as-rtx3090-chat-kv-blocks-given/chat.db): its best configurations are
    queued after the baselines (`--from-study`)."""
    db = WORK / "chat.db"
    if not db.exists() and os.environ.get("CHAT_DB"):
        db.write_bytes(Path(os.environ["CHAT_DB"]).read_bytes())
    url = f"sqlite:///{db}"
    t0 = time.time()
    study = study_file(CHAT)
    source = os.environ.get("CHAT_FROM")
    warm = ["--from-study", "h200-as-3090-chat", "--from-storage", f"sqlite:///{(ROOT / source).resolve()}"]
    warm = warm if source else []
    steps = {"run": autotune(["run", str(study), "--budget", f"{int(seconds)}s", "--gpus", "0", "--storage", url,
                              *warm], seconds + 420)}
    left = (until_s or 0) - (time.time() - t0) - 60  # a minute for status and export
    if left > 0:
        steps["compare"] = autotune(["compare", str(study), "--budget", f"{int(left)}s", "--storage", url], left + 420)
    for name, args in (("status", ["status"]), ("export", ["export", "--format", "flags"])):
        steps[name] = autotune([*args, "--study", "h200-as-3090-chat", "--storage", url], 60)
    record(f"chat:{t0:.0f}", {"t0": t0, "t1": time.time(), "steps": steps})
    for name, step in steps.items():
        print(f"== {name} (rc {step['rc']})", step["stdout"][-4000:], step["stderr"][-1500:], sep="\n")


def autotune(args: list[str], timeout_s: float) -> dict[str, object]:
    """One autotune command, its exit status and the tails of what it printed."""
    out = subprocess.run([PY, "-m", "autotune.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)
    return {"rc": out.returncode, "stdout": out.stdout[-8000:], "stderr": out.stderr[-4000:]}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("idle", "trials", "study", "chat"):
        raise SystemExit(__doc__)
    phase = sys.argv[1]
    WORK.mkdir(parents=True, exist_ok=True)
    write_model()
    if phase == "idle":
        idle()
        return
    samplers = Samplers(phase)
    try:
        if phase == "trials":
            first, *rest = [lambda n=n, f=f: library_trial(n, f) for n, f in TRIALS.items()]
            for step in (first, cli_defaults_trial, *rest):  # the success path first, then the failure
                try:
                    step()
                except Exception as e:  # one step's failure must not cost the others
                    record(f"error:{time.time():.0f}", repr(e))
                    print("step failed:", repr(e), flush=True)
        elif phase == "study":
            study()
        elif phase == "chat":
            chat(float(sys.argv[2]) if len(sys.argv) > 2 else 300.0, float(sys.argv[3]) if len(sys.argv) > 3 else None)
        else:
            raise SystemExit(f"unknown phase {phase!r}")
    finally:
        samplers.stop()


if __name__ == "__main__":
    main()

"""Boot a list of vLLM configurations one after another on the GPU machine, capped as a 24 GiB card, and record
what each printed (KV tokens, concurrency, memory terms), the NVML peak while booting and while serving, and whether
one request of the full max_model_len prefills and decodes. The memory estimator's ground truth.

    python3 -m benchmarks.h200.boot_matrix PLAN.json OUTDIR [--seconds N] [--only NAME,NAME]

PLAN.json: {"model_config": "path/to/config.json" (from the repository root), "card_mib": 24576,
            "boots": [{"name": "...", "util": 0.92, "flags": {"max-model-len": 131072, ...}}, ...]}
Flags with value true are bare flags. Writes OUTDIR/boots.json after every boot and keeps each server log in
OUTDIR/logs/. Standard library and nvidia-ml-py only (the GPU image has both).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchmarks.gpu_boots_table import parse_log

BOOT_TIMEOUT_S = 900
REQUEST_TIMEOUT_S = 600
ANSWER_TOKENS = 4


class PeakSampler(threading.Thread):
    """The card's used memory (NVML, MiB) every 0.2 s; peak() is the largest seen since the last reset()."""

    def __init__(self, card_mib: int) -> None:
        super().__init__(daemon=True)
        self._peak, self._card_mib = 0, card_mib
        try:  # no NVML (the CPU build, for a dry run of the plan): peaks read 0, the total is the card's
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - pynvml raises its own error types, or ImportError
            self._nvml = None
        self.start()

    def used_mib(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used // 2**20) if self._nvml else 0

    def total_mib(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).total // 2**20) if self._nvml else self._card_mib

    def run(self) -> None:
        while True:
            self._peak = max(self._peak, self.used_mib())
            time.sleep(0.2)

    def reset(self) -> int:
        peak, self._peak = self._peak, self.used_mib()
        return peak


def server_command(model_dir: Path, port: int, util: float, flags: dict[str, object]) -> list[str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--load-format", "dummy", "--language-model-only",
           "--skip-tokenizer-init", "--gdn-prefill-backend", "triton", "--gpu-memory-utilization", f"{util:.6f}"]
    for key, value in flags.items():
        cmd += [f"--{key}"] if value is True else [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return cmd


def wait_ready(proc: subprocess.Popen[bytes], port: int) -> str:
    end = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            return "failed"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return "ready"
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return "timeout"


def full_length_request(port: int, max_model_len: int, vocab: int) -> dict[str, object]:
    """One completion whose prompt fills max_model_len but for the answer: does it prefill and decode?"""
    prompt = [random.randrange(100, vocab - 100) for _ in range(max_model_len - ANSWER_TOKENS - 8)]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
        model = json.load(r)["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": ANSWER_TOKENS, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            out = json.load(r)
        return {"ok": True, "prompt_tokens": len(prompt), "seconds": round(time.monotonic() - start, 1),
                "completion_tokens": out.get("usage", {}).get("completion_tokens")}
    except Exception as exc:  # noqa: BLE001 - the failure itself is the record
        return {"ok": False, "prompt_tokens": len(prompt), "seconds": round(time.monotonic() - start, 1),
                "error": f"{type(exc).__name__}: {exc}"[:300]}


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_card_empty(nvml: PeakSampler, idle_mib: int) -> None:
    end = time.monotonic() + 60
    while time.monotonic() < end and nvml.used_mib() > idle_mib + 256:
        time.sleep(1)


def one_boot(boot: dict, plan: dict, model_dir: Path, out: Path, nvml: PeakSampler, idle_mib: int) -> dict:
    util = boot["util"] * plan["card_mib"] / nvml.total_mib()  # vLLM takes util x the card's total
    log = out / "logs" / f"{boot['name']}.log"
    cmd = server_command(model_dir, 8100, util, boot["flags"])
    nvml.reset()
    start = time.monotonic()
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        outcome = wait_ready(proc, 8100)
        boot_s = round(time.monotonic() - start, 1)
        peak_boot = nvml.reset()
        used_ready = nvml.used_mib()
        request = None
        if outcome == "ready":
            request = full_length_request(8100, int(boot["flags"]["max-model-len"]), plan["vocab"])
            request["alive_after"] = proc.poll() is None
        peak_serve = nvml.reset()
        stop(proc)
    wait_card_empty(nvml, idle_mib)
    text = log.read_text(errors="replace")
    return {"name": boot["name"], "util": boot["util"], "vllm_util": round(util, 6), "flags": boot["flags"],
            "outcome": outcome, "boot_s": boot_s, "nvml_peak_boot_mib": peak_boot, "nvml_used_ready_mib": used_ready,
            "nvml_peak_serve_mib": peak_serve if request else None, "full_length_request": request,
            "cache": "warm" if "Directly load the compiled graph" in text else
                     "cold" if "Compiling a graph for" in text else "unknown",
            "figures": parse_log(text), "command": cmd[1:]}


def main(argv: list[str]) -> int:
    plan_path, out = Path(argv[0]), Path(argv[1])
    seconds = float(argv[argv.index("--seconds") + 1]) if "--seconds" in argv else 1e9
    only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else None
    plan = json.loads(plan_path.read_text())
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    config = json.loads(Path(plan["model_config"]).read_text())  # relative to the repository root
    (model_dir / "config.json").write_text(json.dumps(config))
    plan["vocab"] = config.get("text_config", config).get("vocab_size", 32000)
    nvml = PeakSampler(plan["card_mib"])
    idle_mib = nvml.used_mib()
    results_path = out / "boots.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {"boots": []}
    done = {b["name"] for b in results["boots"]}
    end = time.monotonic() + seconds
    for boot in plan["boots"]:
        if boot["name"] in done or (only and boot["name"] not in only):
            continue
        if time.monotonic() + boot.get("expect_s", 120) > end:
            print(f"{boot['name']}: not started, {end - time.monotonic():.0f} s left", flush=True)
            continue
        record = one_boot(boot, plan, model_dir, out, nvml, idle_mib)
        results["boots"].append(record)
        results_path.write_text(json.dumps(results, indent=1))
        fig = record["figures"]
        print(f"{record['name']}: {record['outcome']} {record['cache']} {record['boot_s']} s, "
              f"KV {fig.get('kv_cache_tokens')} tokens {fig.get('kv_cache_gib')} GiB, "
              f"request {record['full_length_request']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

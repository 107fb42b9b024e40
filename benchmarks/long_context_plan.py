"""The plan of an out-of-sample GPU response surface: a space-filling design of the RTX 3090 space opened to long
contexts, written to benchmarks/data/rtx3090-long-context-surface-plan/plan.json before anything was recorded on it
or replayed, so that it holds no search method's proposals (the chat plan appended the default's own start picks).

The space is studies/qwen3.5-27b-rtx3090-long-context.toml's without its `model` choice (the study's checkpoint,
Qwen3.5-27B GPTQ-Int4), with max_num_seqs opened to 1-64 (log) and gpu_memory_utilization to 0.88-0.97: contexts of
32,768-262,144 tokens, KV cache auto or fp8, MTP off or 1-4 tokens, prefill chunks of 2,048-16,384 tokens, prefix
caching on or off. The workload is the study's objective, objectives/long-context-agentic.toml (16k-120k-token
prompts behind a 16k shared prefix, short answers; p95 TTFT <= 60 s, TPOT <= 100 ms). The design, over 1024
scrambled Sobol points (scipy.stats.qmc, seed SEED; each coordinate in the parameter's own scale,
surface_plan.from_unit) that vLLM accepts: the study's 2 baselines; the first POINTS that the estimator does not
refuse for an RTX 3090 and vLLM VLLM_VERSION (about three in four of the space are refused: long contexts for many
sequences do not fit beside the weights, so a design drawn over all of it would measure a handful); and the first
REFUSED that it refuses, booted once to record how they fail (what a search without the estimator pays for them).

    python -m benchmarks.long_context_plan --out PATH   # draws it again (with today's estimator: the committed plan
                                                        # is frozen as drawn)
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from scipy.stats import qmc

from autotune.config.params import Param
from autotune.config.study_file import StudySpec, load_study
from autotune.engine.flags import invalid_reason
from autotune.fit import feasibility
from autotune.fit.hardware import GpuProfile, get_profile
from autotune.measure.plan import configured
from autotune.search.space import baseline_params, engine_config
from benchmarks.catalogue import DATA
from benchmarks.record_surface import save
from benchmarks.surface import space_as_json
from benchmarks.surface_plan import from_unit

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "studies" / "qwen3.5-27b-rtx3090-long-context.toml"
PLAN = DATA / "rtx3090-long-context-surface-plan" / "plan.json"
CARD = "rtx3090"
VLLM_VERSION = "0.32.0"  # the current release, which the surface is to be recorded with
POINTS = 32
REFUSED = 8
SEED = 0
OPENED = {"max_num_seqs": Param("max_num_seqs", "int", low=1, high=64, log=True, default=256),
          "gpu_memory_utilization": Param("gpu_memory_utilization", "float", low=0.88, high=0.97, step=0.01,
                                          default=0.92)}


def planned_for() -> tuple[StudySpec, tuple[Param, ...], GpuProfile]:
    """The study, its space without `model` and with OPENED's ranges, and the card: what the design is drawn on."""
    spec = load_study(STUDY)
    space = tuple(OPENED.get(p.name, p) for p in spec.space if p.name != "model")
    return replace(spec, space=space), space, get_profile(CARD)


def verdict(spec: StudySpec, profile: GpuProfile, params: dict[str, object],
            baseline: dict[str, object] | None = None) -> dict[str, object]:
    """The estimator's verdict for vLLM VLLM_VERSION, as a study of this space would meet it before boot."""
    config = engine_config(spec, params, baseline=baseline)
    path, flags = configured(config.model, config.flags)
    v = feasibility.judge(path, profile, flags, spec.env, (), VLLM_VERSION)
    e = v.estimate
    return {"refused": e.refused, "fits": e.fits, "kv_tokens": e.kv_tokens, "kv_tokens_low": e.kv_tokens_low,
            "kv_tokens_high": e.kv_tokens_high, "max_model_len": e.max_model_len, "reason": v.reason}


def accepted(spec: StudySpec, params: dict[str, object]) -> bool:
    """vLLM starts with these flags (flags.invalid_reason): the others autotune refuses before any boot."""
    config = engine_config(spec, params)
    return invalid_reason(configured(config.model, config.flags)[1]) is None


def plan() -> dict[str, object]:
    spec, space, profile = planned_for()
    configs: list[dict[str, object]] = []
    for b in spec.baselines:
        configs.append({"params": baseline_params(b, space), "origin": "baseline", "baseline": b.name,
                        "estimate": verdict(spec, profile, baseline_params(b, space), dict(b.flags))})
    drawn = [from_unit(space, list(u)) for u in qmc.Sobol(d=len(space), scramble=True, seed=SEED).random_base2(10)]
    valid = [params for params in drawn if accepted(spec, params)]
    judged = [(params, verdict(spec, profile, params)) for params in valid]
    fits = [(params, e) for params, e in judged if not e["refused"]]
    refused = [(params, e) for params, e in judged if e["refused"]]
    for origin, chosen in (("sobol", fits[:POINTS]), ("sobol-refused", refused[:REFUSED])):
        configs += [{"params": params, "origin": origin, "estimate": e} for params, e in chosen]
    seen = judged.index(fits[POINTS - 1]) + 1  # how far into the sequence the POINTS accepted ones reach
    return {"format": 2, "study": str(STUDY.relative_to(REPO)), "model": spec.model.path,
            "objective": str(spec.objective.path.relative_to(REPO)), "card": CARD, "vllm": VLLM_VERSION,
            "space": space_as_json(space),
            "how": (f"the study's {len(spec.baselines)} baselines; of {len(drawn)} scrambled Sobol points "
                    f"(scipy.stats.qmc, seed {SEED}) over the space without `model`, max_num_seqs 1-64 and "
                    f"gpu_memory_utilization 0.88-0.97, log-scaled where the parameter is, that vLLM accepts "
                    f"({len(drawn) - len(valid)} it refuses at startup), the first {POINTS} the estimator does not "
                    f"refuse for an RTX 3090 with vLLM {VLLM_VERSION} (uncalibrated; the first {seen} of the sequence "
                    f"hold them, {seen - POINTS} refused among those), and the first {REFUSED} it refuses, to be "
                    "booted once to record how they fail. Drawn before any recording or replay on it: no search "
                    "method's proposal is in it"),
            "configs": configs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="where to write it (the committed plan is frozen)")
    opts = ap.parse_args()
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    doc = plan()
    save(doc, opts.out)
    print(f"{opts.out}: {len(doc['configs'])} configurations; {doc['how']}")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()

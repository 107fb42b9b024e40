"""The configuration list of the GPU response surface written once to
benchmarks/data/rtx3090-surface-plan/awq.json and recorded by benchmarks/record_surface.py --plan on the device.

The space is studies/qwen3.5-27b-h200-as-3090.toml's (the 3090 study's, capped to 24 GiB on a larger card) without
its `model` choice: the model is the Qwen3.5-27B AWQ shape the device runs (random weights). Three sources:
  1. the study's baselines (vLLM's defaults, expected not to fit; the recipe);
  2. the first SOBOL_POINTS configurations of a scrambled Sobol sequence (scipy.stats.qmc, seed 0) over the space
     that vLLM accepts (flags.invalid_reason: the others autotune refuses before any boot), each coordinate
     mapped to a parameter in the space's own scale (log for log ints), so the set covers it evenly;
  3. UNSURE configurations the estimator is least sure about, out of CANDIDATES more Sobol points: those it boots
     to learn (not refused, yet the central prediction does not fit), then those whose pessimistic KV capacity
     (`kv_tokens_low`) is nearest one max_model_len request;
  4. (added after 19 were recorded, `--picks`) the first start pick of the replay's first PICK_SEEDS seeds
     (search/start.py: of START_CANDIDATES random configurations, the one the estimator says runs the most at
     once): none of 1-3 reaches the capacity the picks seek, so only these test, out of sample, the premise the
     default's start rests on (that such a configuration serves near the best).
Every configuration carries the estimator's verdict (refused / fits / kv_tokens and its range), so the replay
scores refusals against what booting it did. Configurations it refuses are booted once all the same: how they
fail is part of the surface.

    .venv/bin/python -m benchmarks.surface_plan     # rewrites the plan (deterministic; source 4 kept if planned)
    .venv/bin/python -m benchmarks.surface_plan --picks   # appends source 4 to the plan and the surface recorded
    .venv/bin/python -m benchmarks.surface_plan --checkpoint Qwen/Qwen3.5-27B-GPTQ-Int4 --take 1,8,9,5 \
        --out benchmarks/data/rtx3090-surface-plan/gptq.json   # those four served from another checkpoint
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
from pathlib import Path

from scipy.stats import qmc

from autotune.config.params import Param
from autotune.config.study_file import StudySpec, load_study
from autotune.engine.flags import invalid_reason
from autotune.fit import feasibility, memcap
from autotune.fit.hardware import GpuProfile, get_profile
from autotune.measure.plan import configured
from autotune.search import start
from autotune.search.screen import runs_at_once
from autotune.search.space import baseline_params, condition_met, engine_config
from benchmarks.catalogue import DATA
from benchmarks.record_surface import DEVICE_VLLM, GPU_OUT, device_vllm, save
from benchmarks.surface import space_as_json

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "studies" / "qwen3.5-27b-h200-as-3090.toml"
PLAN = DATA / "rtx3090-surface-plan" / "awq.json"
MODEL = "QuantTrio/Qwen3.5-27B-AWQ"  # the AWQ shape of autotune/engine/known_models/qwen3.5-27b-awq.json
CARD = "h200"  # the device; capped to the study's memory_cap_gib
SOBOL_POINTS = 32
CANDIDATES = 1024
UNSURE = 8
PICK_SEEDS = 3


def from_unit(space: tuple[Param, ...], u: list[float]) -> dict[str, object]:
    """One point of the unit cube as the space's values (one coordinate per parameter, conditions applied)."""
    out: dict[str, object] = {}
    for p, x in zip(space, u, strict=True):
        if not condition_met(p, out):
            continue
        if p.type in ("int", "float"):
            lo, hi = float(p.low), float(p.high)  # type: ignore[arg-type]
            v = math.exp(math.log(lo) + x * (math.log(hi) - math.log(lo))) if p.log else lo + x * (hi - lo)
            if p.type == "int":
                out[p.name] = min(int(hi), max(int(lo), round(v)))
            else:
                step = p.step or 0.0
                out[p.name] = round(round(v / step) * step, 6) if step else v
        else:
            choices = list(p.choices) if p.type == "categorical" else [False, True]
            out[p.name] = choices[min(int(x * len(choices)), len(choices) - 1)]
    return out


def rejected(spec, params: dict[str, object]) -> bool:
    """Whether vLLM refuses these flags at startup (flags.invalid_reason): autotune refuses them before any boot,
    so booting them would record nothing a search pays for."""
    config = engine_config(spec, {**params, "model": MODEL})
    return invalid_reason(configured(config.model, config.flags)[1]) is not None


def verdict(spec, profile, params: dict[str, object], baseline: dict[str, object] | None = None,
            model: str = MODEL) -> dict[str, object]:
    config = engine_config(spec, {**params, "model": model}, baseline=baseline)
    path, flags = configured(config.model, config.flags)
    v = feasibility.judge(path, profile, flags, spec.env)
    e = v.estimate
    return {"refused": e.refused, "fits": e.fits, "kv_tokens": e.kv_tokens, "kv_tokens_low": e.kv_tokens_low,
            "kv_tokens_high": e.kv_tokens_high, "max_model_len": e.max_model_len, "reason": v.reason}


def planned_for() -> tuple[StudySpec, tuple[Param, ...], GpuProfile]:
    """The study, its space without `model`, and the card capped as the study says: what every source plans on."""
    spec = load_study(STUDY)
    space = tuple(p for p in spec.space if p.name != "model")
    return spec, space, memcap.capped_profile(get_profile(CARD), spec.memory_cap)  # type: ignore[arg-type]


def plan() -> dict[str, object]:
    spec, space, profile = planned_for()
    configs: list[dict[str, object]] = []
    for b in spec.baselines:
        params = baseline_params(b, space)
        configs.append({"params": params, "origin": "baseline", "baseline": b.name,
                        "estimate": verdict(spec, profile, params, {**b.flags, "model": MODEL})})
    sobol = qmc.Sobol(d=len(space), scramble=True, seed=0).random_base2(11)  # 2048: balanced prefixes
    points = [from_unit(space, list(u)) for u in sobol]
    valid = [params for params in points if not rejected(spec, params)]
    for params in valid[:SOBOL_POINTS]:
        configs.append({"params": params, "origin": "sobol", "estimate": verdict(spec, profile, params)})
    candidates = [(params, verdict(spec, profile, params)) for params in valid[SOBOL_POINTS:SOBOL_POINTS + CANDIDATES]]

    def unsure(c: tuple[dict, dict]) -> tuple[bool, float]:
        e = c[1]
        inside = not e["refused"] and not e["fits"]
        return (not inside, abs(math.log(max(e["kv_tokens_low"], 1) / max(e["max_model_len"], 1))))

    for params, est in sorted(candidates, key=unsure)[:UNSURE]:
        configs.append({"params": params, "origin": "unsure", "estimate": est})
    return {"format": 2, "study": str(STUDY.relative_to(REPO)), "model": MODEL, "card": CARD,
            "memory_cap_gib": spec.memory_cap.gib if spec.memory_cap else None,  # type: ignore[attr-defined]
            "space": space_as_json(space),
            "how": (f"the study's {len(spec.baselines)} baselines; the first {SOBOL_POINTS} scrambled Sobol points "
                    f"(scipy.stats.qmc, seed 0) over the space without `model`, log-scaled where the parameter is, "
                    f"that vLLM accepts ({len(points) - len(valid)} of the {len(points)} it refuses at startup, "
                    f"as autotune does before booting, are left out); "
                    f"the {UNSURE} of "
                    f"{CANDIDATES} further Sobol points the estimator is least sure about (booted to learn first, "
                    f"then pessimistic KV tokens nearest one max_model_len request). Estimates: uncalibrated, "
                    f"{CARD} capped to {spec.memory_cap}, for vLLM {DEVICE_VLLM}'s CUDA build (the device's)"),
            "configs": configs}


def start_picks(seeds: int = PICK_SEEDS) -> list[dict[str, object]]:
    """Source 4: what the replay's seed s boots first without baselines, search/start.py's pick from the draw
    search/one_trial.py makes (candidates of seed s * 10_007 with no trial yet), judged on the capped card."""
    spec, space, profile = planned_for()
    out = []
    for seed in range(seeds):
        best = start.best_of(start.candidates(space, seed * 10_007, start.START_CANDIDATES),
                             lambda params: runs_at_once(spec, profile, MODEL, params))
        assert best is not None, "the estimator refuses every candidate"
        params, runs = best
        out.append({"params": params, "origin": "pick", "runs_at_once": runs, "seed": seed,
                    "estimate": verdict(spec, profile, params)})
    return out


PICKS_HOW = (f"; then (2026-12-05, after 19 were recorded) the first start pick of seeds 0-{PICK_SEEDS - 1} "
             f"(search/start.py: the most of {start.START_CANDIDATES} random configurations that the estimator "
             f"accepts, by what it runs at once), to test that premise out of sample")


def append_picks(plan_path: Path = PLAN, surface_path: Path = GPU_OUT) -> list[dict[str, object]]:
    """Append source 4 to the plan and keep the surface recorded from it resumable (the recorder resumes a
    surface only from the plan it was recorded from: its `how`). The planned configurations before stay as
    they are, indices included."""
    doc = json.loads(plan_path.read_text())
    if doc["how"].endswith(PICKS_HOW):
        raise SystemExit(f"{plan_path}: the start picks are already planned")
    with device_vllm():
        picks = start_picks()
    planned = {json.dumps(c["params"], sort_keys=True) for c in doc["configs"]}
    new = [c for c in picks if json.dumps(c["params"], sort_keys=True) not in planned]
    old_how = doc["how"]
    doc["how"] += PICKS_HOW
    doc["configs"] += new
    plan_path.write_text(json.dumps(doc, indent=1) + "\n")
    if surface_path.exists():
        surface = json.loads(surface_path.read_text())
        prov = surface["provenance"]
        if prov["how"] == old_how:
            prov["how"] = doc["how"]
            first, last = len(doc["configs"]) - len(new), len(doc["configs"]) - 1
            prov["plan_revised"] = (prov.get("plan_revised", "") + f" {datetime.date.today()}: {len(new)} start picks "
                                    f"appended (plan indices {first}-{last}).")
            save(surface, surface_path)
    return new


def checkpoint_plan(model: str, indices: list[int], plan_path: Path = PLAN) -> dict[str, object]:
    """Some of the plan's configurations, the same params and flags, served from another checkpoint of the same
    model (`model`, a shipped config): what its weights leave a 3090 is measured beside the plan's own, boot by
    boot. Each keeps its index in the plan (`from_plan_index`) and is judged again for the other checkpoint."""
    doc = json.loads(plan_path.read_text())
    missing = [i for i in indices if not 0 <= i < len(doc["configs"])]
    if missing:
        raise SystemExit(f"--take: {plan_path.name} has no configuration {', '.join(f'#{i}' for i in missing)}")
    spec, _, profile = planned_for()
    baselines = {b.name: b.flags for b in spec.baselines}
    configs = []
    for i in indices:
        c = doc["configs"][i]
        baseline = {**baselines[c["baseline"]], "model": model} if c.get("baseline") else None
        configs.append({**{k: v for k, v in c.items() if k != "estimate"}, "from_plan_index": i,
                        "estimate": verdict(spec, profile, c["params"], baseline, model)})
    estimates = doc["how"].split("Estimates: ")[-1].split("; then")[0]
    return {**doc, "model": model, "configs": configs,
            "how": f"{plan_path.relative_to(DATA)}'s configurations {', '.join(f'#{i}' for i in indices)} (the same "
                   f"params and flags) served from {model} instead of {doc['model']}: the other checkpoint's weights "
                   f"beside the plan's own. Estimates for it, as the plan's: {estimates}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--picks", action="store_true", help="Append the start picks (source 4) to the plan.")
    ap.add_argument("--checkpoint", metavar="HUB_ID", help="Write a plan of the configurations --take names, "
                    "served from this checkpoint (a shipped config), to --out.")
    ap.add_argument("--take", type=lambda v: [int(i) for i in v.split(",")], default=[], help="Plan indices, e.g. 1,9.")
    ap.add_argument("--out", type=Path, help="Where --checkpoint's plan goes.")
    opts = ap.parse_args()
    if opts.checkpoint:
        if not opts.take or opts.out is None:
            ap.error("--checkpoint needs --take and --out")
        with device_vllm():
            doc = checkpoint_plan(opts.checkpoint, opts.take)
        opts.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{opts.out}: {len(opts.take)} configurations of {PLAN.relative_to(DATA)} served from {opts.checkpoint}")
        return
    if opts.picks:
        for c in append_picks():
            print(f"start pick, seed {c['seed']}: runs {c['runs_at_once']:g} at once: {c['params']}")
        return
    had_picks = PLAN.exists() and json.loads(PLAN.read_text())["how"].endswith(PICKS_HOW)
    with device_vllm():
        doc = plan()
        if had_picks:  # kept: the surface recorded from the plan resumes only from the same `how`
            doc["how"] += PICKS_HOW
            doc["configs"] += start_picks()  # type: ignore[operator]
    PLAN.write_text(json.dumps(doc, indent=1) + "\n")
    est = [c["estimate"] for c in doc["configs"]]  # type: ignore[union-attr]
    print(f"{PLAN}: {len(est)} configurations, {sum(e['refused'] for e in est)} refused by the estimator, "
          f"{sum(not e['refused'] and not e['fits'] for e in est)} inside its band")


if __name__ == "__main__":
    main()

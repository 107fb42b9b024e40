"""The old load ladder against the new one, on the same real vLLM CPU servers and configurations.

For each configuration (the two baselines of studies/tiny-cpu.toml, then a sampled one with a small batch),
one server is booted and both ladders measure it, one after the other, in alternating order, from the same prior:
the first configuration with no history (its capacity sets the first level), the next ones with what the
earlier ones reached (the incumbent's best level; the sampled configuration is screened there). On the first
server both also re-measure it from its best level, as a study's re-measurement of its incumbent does.
  - old: the ladder of commit 8069757, loaded from git as it was: the ramp judged sequentially, every bisection
    level exact, the best level measured exactly once more when only the sequential verdict passed it (so a
    re-measurement's first level, most often its answer, twice);
  - new: autotune.measure.ladder: bisection levels judged sequentially too (only the answer is exact), and a
    re-measurement's first level measured exactly at once (Prior.exact_first).
(Until this change the old ladder was commit 02e0249's, from 1 with every level in full; see git history.)
It prints, per configuration and ladder, measurement seconds, requests (warm-up included), levels (+ passed,
- failed, ~ judged sequentially, else exact; requests in brackets), the chosen level and its throughput;
then medians and ratios, and whether both chose the same level within one bisection
step (|old - new| <= max(tolerance x the larger, 1)).

    PYTHONPATH=. .venv/bin/python -m benchmarks.trial_cost [--configs 3]

Takes /tmp/autotune-engine.lock for the whole run (one vLLM server on the machine at a time).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from autotune.config.study_file import load_study
from autotune.engine.server import launch
from autotune.fit import feasibility
from autotune.fit.hardware import GpuProfile
from autotune.measure import ladder
from autotune.measure.client import LoadLevel, measure_level
from autotune.measure.plan import TrialPlan, configured, plan_trial
from autotune.measure.stats import judge, level_stats
from autotune.measure.trial import LevelOutcome
from autotune.measure.workload import prompt_decoder
from autotune.search.space import engine_config
from benchmarks.engine_lock import engine_lock

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "8069757"
SAMPLED = {"max_num_seqs": 2, "max_num_batched_tokens": 512, "enable_chunked_prefill": True,
           "enable_prefix_caching": False, "max_model_len": 1024}


def old_ladder() -> ModuleType:
    """measure/ladder.py as it was before this change, imported from git under another name."""
    source = subprocess.run(["git", "show", f"{OLD_COMMIT}:autotune/measure/ladder.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("old_ladder", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_ladder"] = module  # dataclasses look their module up by name
    exec(compile(source, f"{OLD_COMMIT}:autotune/measure/ladder.py", "exec"), module.__dict__)
    return module


@dataclass
class Run:
    seconds: float
    requests: int
    levels: list[tuple[float, bool, bool, int]]  # (level, passed, exact, requests)
    best_level: float | None
    throughput: float
    screened_out: bool = False


def measure_with(plan: TrialPlan, base_url: str, model: str, rule, counter: list[int]):
    """A measure(level) for a ladder, with the stop rule that ladder chooses (`rule(level, exact)`)."""
    objective = plan.objective
    workload, limits = objective.workload, objective.limits
    decode = prompt_decoder(plan.engine.model) if workload.prompt == "text" else None

    def measure(value: float, exact: bool = True) -> LevelOutcome:
        stop = rule(value, exact)
        w = objective.load.warmup_requests
        seed = counter[0]
        counter[0] += 1
        requests = workload.requests(stop.max_requests + w, plan.vocab_size, seed_offset=seed, decode=decode)
        run = measure_level(base_url, model, requests[w:], LoadLevel(objective.load.mode, value), warmup=requests[:w],
                            seed=workload.arrival_seed(seed),
                            enough=lambda done, flying, now: stop.reason(done, limits, flying, now))
        stats = level_stats(run, limits)
        return LevelOutcome(stats, judge(stats, limits), hung=run.hung)
    return measure


def summarise(t0: float, sla, warmup: int, screened: bool = False) -> Run:
    steps = [(s.level, s.passed, s.exact, s.outcome.stats.completed + s.outcome.stats.failed + warmup)
             for s in sla.steps]
    best = sla.best
    return Run(time.monotonic() - t0, sum(n for *_, n in steps), steps, sla.best_level,
               best.stats.output_throughput if best else 0.0, screened)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=3, choices=(1, 2, 3))
    args = ap.parse_args()
    spec = load_study(REPO / "studies/tiny-cpu.toml")
    objective = spec.objective
    old = old_ladder()
    old_search = old.LoadSearch(**{k: getattr(objective.load, k) for k in old.LoadSearch.__dataclass_fields__})
    configs = [(f"baseline {b.name}", engine_config(spec, {}, baseline=b.flags)) for b in spec.baselines]
    configs.append(("sampled max_num_seqs=2", engine_config(spec, SAMPLED)))
    configs = configs[: args.configs]
    profile: GpuProfile = feasibility.resolve_profile(spec.hardware, True)
    w = objective.workload
    per_request = w.input_len.mean + w.output_len.mean
    results: list[tuple[str, Run, Run]] = []
    incumbent: float | None = None
    with engine_lock(), tempfile.TemporaryDirectory() as tmp:
        for i, (label, config) in enumerate(configs):
            model_path, flags = configured(config.model, config.flags)
            estimate = feasibility.judge(model_path, profile, flags, spec.env).estimate
            seqs = flags.get("max_num_seqs")
            cap = ladder.capacity(float(seqs) if isinstance(seqs, int | float) else None, estimate.kv_tokens,
                                  per_request)
            prior = ladder.Prior(incumbent=incumbent, cap=cap, screen=incumbent is not None and "sampled" in label)
            plan = plan_trial(model_path, flags, objective, Path(tmp) / f"server-{i}.log", env=spec.env,
                              boot_timeout_s=600)
            t_boot = time.monotonic()
            with launch(plan.engine, Path(tmp) / f"server-{i}.log") as (server, _info):
                print(f"{label}: booted in {time.monotonic() - t_boot:.0f} s; new ladder's prior {prior}", flush=True)
                counter = [0]
                new_measure = measure_with(plan, server.base_url, server.model,
                                           objective.load.stop_rule, counter)
                old_measure = measure_with(plan, server.base_url, server.model,
                                           old_search.stop_rule, counter)

                def both(prior: ladder.Prior, order: tuple[str, str], old_measure=old_measure,
                         new_measure=new_measure) -> dict[str, Run]:
                    """Both ladders on this server from one prior, in that order."""
                    old_prior = old.Prior(incumbent=prior.incumbent, similar=prior.similar, cap=prior.cap,
                                          screen=prior.screen)  # exact_first is the new ladder's
                    runs: dict[str, Run] = {}
                    for which in order:
                        t0 = time.monotonic()
                        if which == "old":
                            sla = old.find_sustainable(old_measure, lambda o: o.verdict.passed, old_search, old_prior)
                        else:
                            sla = ladder.find_sustainable(new_measure, lambda o: o.verdict.passed, objective.load,
                                                          prior)
                        r = runs[which] = summarise(t0, sla, objective.load.warmup_requests, sla.screened_out)
                        print(f"  {which}: {r.seconds:.0f} s, {r.requests} requests, levels "
                              + " ".join(f"{lv:g}{'+' if ok else '-'}{'' if ex else '~'}({n})"
                                         for lv, ok, ex, n in r.levels)
                              + (" -> screened out" if r.screened_out else f" -> best {r.best_level}, "
                                 f"{r.throughput:.0f} tok/s"), flush=True)
                    return runs

                runs = both(prior, ("old", "new") if i % 2 == 0 else ("new", "old"))
                results.append((label, runs["old"], runs["new"]))
                if i == 0 and runs["new"].best_level is not None:  # a study's re-measurement of its incumbent
                    again = ladder.Prior(incumbent=runs["new"].best_level, cap=cap, exact_first=True)
                    print(f"  re-measurement: new ladder's prior {again}", flush=True)
                    remeasured = both(again, ("new", "old"))
                    results.append((f"re-measure {label.split()[-1]}", remeasured["old"], remeasured["new"]))
            if incumbent is None or (runs["new"].best_level or 0) > incumbent:
                incumbent = runs["new"].best_level
    tol = objective.load.tolerance
    print()
    print(f"{'configuration':26} {'ladder':6} {'seconds':>8} {'requests':>9} {'levels':>7} {'best level':>11} "
          f"{'tok/s':>7}  same answer")
    for label, o, n in results:
        for which, r in (("old", o), ("new", n)):
            same = ""
            if which == "new":
                if n.screened_out or o.screened_out:
                    same = "both screened out" if n.screened_out and o.screened_out else "NO (one screened out)"
                elif o.best_level is not None and n.best_level is not None:
                    ok = abs(o.best_level - n.best_level) <= max(tol * max(o.best_level, n.best_level), 1)
                    same = "yes (within one bisection step)" if ok else "NO"
                else:
                    same = "yes (neither feasible)" if o.best_level == n.best_level else "NO"
            level = "screened" if r.screened_out else f"{r.best_level}"
            print(f"{label:26} {which:6} {r.seconds:8.0f} {r.requests:9d} {len(r.levels):7d} {level:>11} "
                  f"{r.throughput:7.0f}  {same}")
    med = {k: {which: statistics.median(getattr(r, k) if k != "levels" else len(r.levels)
                                        for r in (o if which == "old" else n for _, o, n in results))
               for which in ("old", "new")} for k in ("seconds", "requests", "levels")}
    print()
    for k, m in med.items():
        print(f"median {k} per trial: old {m['old']:.0f}, new {m['new']:.0f}; old/new {m['old'] / m['new']:.2f}x")
    total = {which: sum(r.seconds for r in (o if which == "old" else n for _, o, n in results))
             for which in ("old", "new")}
    print(f"total measurement seconds: old {total['old']:.0f}, new {total['new']:.0f}; "
          f"old/new {total['old'] / total['new']:.2f}x")


if __name__ == "__main__":
    main()

"""Whether a fresh server's first level reads low: the level a re-measurement measures first (Prior.exact_first).

Two CPU studies measured their best again at 290 (TPE suggested it again) and 832 (its re-measurement) output
tok/s where the first figures were 1,479 and 1,405, and across one study's eight servers the
first level read 0.82 of the later ones. If a fresh server served its first level slower, a re-measurement (its
answer measured first, exactly, on a fresh server) would be biased low and the winner's figure with it. Here each of
`--servers` fresh servers of the tiny-cpu study's vllm-defaults baseline measures one level exactly `--repeat` times
in a row, as a trial measures its answer (benchmarks.trial_cost.measure_with: warm-up, stop rule and stats as
measure/trial.py). Printed: each server's figures, each later figure over that server's first, and the medians.

    PYTHONPATH=. .venv/bin/python -m benchmarks.first_level [--servers 8] [--level 20] [--repeat 3]

Takes /tmp/autotune-engine.lock for the whole run (one vLLM server on the machine at a time).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from autotune.config.study_file import load_study
from autotune.engine.server import launch
from autotune.measure.plan import configured, plan_trial
from autotune.search.space import engine_config
from benchmarks.engine_lock import engine_lock
from benchmarks.trial_cost import measure_with

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--level", type=float, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    spec = load_study(REPO / "studies/tiny-cpu.toml")
    defaults = next(b for b in spec.baselines if b.name == "vllm-defaults")
    config = engine_config(spec, {}, baseline=defaults.flags)
    model_path, flags = configured(config.model, config.flags)
    firsts: list[float] = []
    ratios: list[float] = []
    with engine_lock(), tempfile.TemporaryDirectory() as tmp:
        for i in range(args.servers):
            log = Path(tmp) / f"server-{i}.log"
            plan = plan_trial(model_path, flags, spec.objective, log, env=spec.env, boot_timeout_s=600)
            t0 = time.monotonic()
            with launch(plan.engine, log) as (server, _info):
                booted = time.monotonic() - t0
                measure = measure_with(plan, server.base_url, server.model, spec.objective.load.stop_rule, [0])
                figures = [measure(args.level, True).stats.output_throughput for _ in range(args.repeat)]
            firsts.append(figures[0])
            ratios += [f / figures[0] for f in figures[1:]]
            print(f"server {i + 1} (booted in {booted:.0f} s): level {args.level:g} exactly, output tok/s "
                  + ", ".join(f"{f:,.0f}" for f in figures)
                  + "; later / first " + ", ".join(f"{f / figures[0]:.2f}" for f in figures[1:]), flush=True)
    print(f"first figures: median {statistics.median(firsts):,.0f} ({min(firsts):,.0f}-{max(firsts):,.0f}); "
          f"later / first over {len(ratios)} pairs: median {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f}-{max(ratios):.2f}); below 1 in {sum(r < 1 for r in ratios)} of {len(ratios)}")


if __name__ == "__main__":
    main()

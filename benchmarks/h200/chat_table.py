"""The device chat study as a table: what each trial cost (boots cold and warm, load levels, requests) and what
the estimator predicted against what vLLM printed. Usage:

    python -m benchmarks.h200.chat_table [benchmarks/data/h200-as-rtx3090-chat-cold-then-warm/chat.db]
"""

from __future__ import annotations

import statistics
import sys

import optuna

DEFAULT_DB = "benchmarks/data/h200-as-rtx3090-chat-cold-then-warm/chat.db"
STUDY = "h200-as-3090-chat"


def main() -> None:
    db = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DB
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")
    print("| trial | configuration | cold boot s | boot s (cache) | levels (concurrency x requests) | trial s |"
          " KV tokens printed | predicted (range) | KV blocks given (vLLM's own) | out tok/s | outcome |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    durations = []
    for t in study.trials:
        a = t.user_attrs
        if "duration_s" not in a:
            continue
        durations.append(a["duration_s"])
        base = a.get("baseline")
        shown = base["flags"] if base else t.params
        flags = (f"baseline {base['name']}: " if base else "") + ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))
        levels = ", ".join(f"{lv['concurrency']:g}x{lv['completed'] + lv['failed']}" for lv in a.get("levels", []))
        cold = f"{a['cold_boot_s']:.0f}" if "cold_boot_s" in a else "-"
        cold += " (failed)" if "cold_boot_failure" in a else ""
        pred = f"{a.get('predicted_kv_tokens', 0):,} ({a.get('predicted_kv_tokens_low', 0):,}-" \
               f"{a.get('predicted_kv_tokens_high', 0):,})"
        given = f"{a['kv_blocks_set']:,} ({a.get('kv_blocks_profiled', 0):,})" if "kv_blocks_set" in a else "-"
        out = f"{a['output_tok_s']:,.0f} at {a['best_level']:g}" if a.get("best_level") else "-"
        print(f"| {t.number} | {flags} | {cold} | {a.get('boot_s', 0):.0f} ({a.get('compile_cache', '-')}) |"
              f" {levels} | {a['duration_s']:.0f} | {a.get('kv_cache_tokens', 0):,} | {pred} | {given} | {out} |"
              f" {a.get('reason') or a.get('status', '')} |")
    if durations:
        print(f"\n{len(durations)} trials booted; median trial {statistics.median(durations):.0f} s;"
              f" study time {sum(durations) / 60:.1f} min")


if __name__ == "__main__":
    main()

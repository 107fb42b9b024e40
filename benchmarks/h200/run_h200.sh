#!/usr/bin/env bash
# The H200 device run: autotune against the real CUDA vLLM 0.25.0 on one lent H200 capped to behave as a 24 GiB
# card (the Qwen3.5-27B shape with random weights and a 4-bit AWQ config). Everything it needs is in this folder:
#   fetch-wheels.sh + wheels-vllm-0.25.0.txt   vLLM 0.25.0 (CUDA 13, for the device image's torch 2.11.0+cu130) and
#                                              the packages it needs that the image lacks, split into .gpu1 ... .gpuN
#   device-install.sh                          on the device: reassembles the vLLM wheel, installs into /tmp/site
#   run_h200.py                                the phases; collect_h200.py turns what they bring back into
#                                              benchmarks/data/h200-cuda-boots/results.json
# The study and objective are tests/data/gpu/smoke-study.toml and smoke-objective.toml; the model is the shipped
# config autotune/engine/known_models/qwen3.5-27b-awq.json, which run_h200.py writes as a model folder under $GPURUN.
#
# Here, once (in the repository root; .gitignore already ignores /.gpu*/ and /.whl/):
#   bash benchmarks/h200/fetch-wheels.sh                               # -> .gpu1 ... .gpuN (50 MiB each)
#   autotune's own dependencies that the device image lacks (seen 2026-12-03), as wheels into .whl:
#   python3 -m pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     optuna==5.1.0 sqlalchemy==2.1.9 alembic==1.20.1 colorlog==6.12.0 mako==1.4.3 \
#     plotly optuna-dashboard bottle kaleido choreographer logistro orjson platformdirs
#   (the first five are what `autotune trial` and `autotune run` import; the rest are for reports and the
#   dashboard. There is no Chrome or Chromium on the image, so PNG export cannot run there.)
# Device calls, back to back on one warm machine (each carries one folder; /tmp survives between them, and the
# machine is given back after about 30 s idle). Seen 2026-12-03 (second session), the whole chat study in one
# session: stage 6..10 (the first call, with the machine's start, held at 85 s; each further stage 4 s), then
# chat-start 1450 .gpu11 carry [".gpu11", ".whl"] (held 164 s: install 35 s, the study started at 55 s; device-install
# now also compiles the bytecode, time not yet seen), then chat-wait 540, 540, 440 back to back (copy each call's
# files_at away before the next: it ended at held 1,409 s). A session leaves room for chat-start of about 1,500 s.
# Seen 2026-12-04 (stop 21): fetch-wheels.sh made .gpu1-.gpu6 (vLLM in five parts, then the rest); .gpu6 and .whl
# together were too big to carry in one call, so one wheel went to .gpu7. stage 1, then a pause over 30 s: the
# machine was given back and stage 1's files with it (stage it again last). stage 1..6, then chat-start 1350 .gpu7
# carry [".gpu7", ".whl"] (install 37 s with the bytecode compiled; study started at held ~274 s), chat-wait 530,
# 530, 370: the run ended at held 1,615 s with 7 configurations booted.
# Seen 2026-12-04 (s22, the GPU surface's first session): stage 1..6 back to back (held 50 s), surface-start 1400
# .gpu7 carry [".gpu7", ".whl"] (install 46 s; recording from held 120 s), surface-wait 540, 540, 520: the recorder
# stopped itself at held 1,349 s (156 s of --stop-after left, the next configuration expected to take 245 s). The
# recorder run again in the foreground in the same call-chain (`timeout 400`, 450 s of device time left) recorded two
# more. 9 configurations in all.
# Seen 2026-12-05 (s26): no machine came, on nvidia-h200 or nvidia-h100-x1, in 10 calls over 80 minutes; each
# refused start cost 90-180 s of the session's device time (1,800 s -> 780 s). Ask `status` first (its none_now says
# when to try again), and keep what a session needs for one configuration (~400 s with staging) before trying.
# Seen 2026-12-05 (s27): five refused starts (539 s), then an H100 on a call that named no kind: stage 1..6 (held
# 630 s), the ballast run (SURFACE=h100-as-rtx3090-awq-capture-pinned/surface.json surface-start 500 .gpu7 --only 42 --ballast; install
# 48 s), then --only 44,9 and, in the foreground, --only 6: all four failed to boot, ~100 s a boot, two boots each
# (benchmarks/data/h100-as-rtx3090-awq-capture-pinned/logs/2026-12-05T1351). The H200 surface cannot resume on an H100: a call naming no kind
# suits the ballast work, which either card answers.
# Seen 2026-12-05 (s28): a call naming nvidia-h200 got an H100 at once (held 86 s at the first call). stage 1..6,
# then SURFACE=h100-as-rtx3090-awq-machete/surface.json surface-start 1480 .gpu7 --only 42,9,44,6 --ballast (install 45 s,
# no Triton cache carried: the first boot compiled it, ready after ~260 s), surface-wait 540 and 540 (all four done at held
# 1,155 s: cold boots 88-134 s with Triton's cache warm), then the recorder in the foreground (timeout 560,
# --only 43,0,1,2): three more. 1,712 s held in all.
# Seen 2026-12-05 (s29): nvidia-h200 asked, an H100 came at once. stage 1..6 and triton-cache (held 49 s), surface-start
# 1480 .gpu7 with SURFACE unset (the H100's file; install 36 s), surface-wait 540, 540, 510: ten configurations,
# the recorder stopped itself at held 1,520 s. With the cache carried, the one
# cold boot that served (#3) was ready in 95 s; the failed boots took 16-108 s each.
# Seen 2026-12-05/06 (s31): no machine in 14 calls over 90 minutes (23:35-01:05), on nvidia-h200 and once
# nvidia-h100-x1 (status named either as the plain kind at times); each refused start cost 90-180 s, each call
# made inside none_now's window 15 s: 1,351 s of the 1,800 went on refusals. Call `status` before each try and run
# only when it shows no none_now; below ~500 s left a fresh machine records nothing (Triton's cold compile).
# Seen 2026-12-06 (s32): eleven refused calls (1,111 s), then an H100 with 689 s left: stage 1..6 back to back (23 s),
# surface-start 620 .gpu7 (install 26 s), surface-wait 520: two of the Marlin file (#0 failed cold 165 s + warm 45 s,
# #1 cold 87 s + warm 57 s and served); 60 s left at the end.
# Seen 2026-12-06 (s33): nvidia-h200 asked, an H100 came at once: stage 1..6 and triton-cache (held 105 s), surface-start
# 1640 .gpu7 (install 48 s, recording from held 180 s), surface-wait 520, 520, 500: eight of the Marlin file (#2-#9),
# the recorder stopped itself at held 1,739 s; 61 s left.
# Seen 2026-12-06 (s34): nvidia-h200 asked, an H100 came at once: stage 1..6 and triton-cache (held 49 s),
# PLAN=rtx3090-surface-plan/gptq.json ... surface-start 760 .gpu7 (install 30 s), surface-wait 520 (the four done at
# held 520 s: all failed loading, the folder had no safetensors, so vLLM left GPTQ's layers in bf16; the folder now
# lists them), then surface-start 1130 .gpu7 (installed already), surface-wait 520, 520: nine of the Marlin file
# (#10-#18), the recorder stopped itself at held 1,595 s; 202 s left.
# Seen 2026-12-06 (s35): nvidia-h200 asked, an H100 came at once (held 85 s at the first call): stage 1..6 and
# triton-cache (held 108 s), PLAN=rtx3090-surface-plan/gptq.json ... surface-start 760 .gpu7 (install 30 s),
# surface-wait 520 and 300 (three of four, the fourth expected to take longer than was left), surface-start 490 and
# surface-wait 500 in one call (the fourth, done at held 957 s: all four served, with the folder listing GPTQ's
# layers), then surface-start 780 .gpu7 and surface-wait 480 in one call, surface-wait 285: five of the Marlin file
# (#19-#23), the recorder stopped itself at held 1,730 s; 69 s left.
# Seen 2026-12-06 (s36): two refused starts (271 s, nvidia-h200 then nvidia-h100-x1), then an H100 on a call naming no
# kind after a seven-minute wait, held 354 s at the first call; stage 1..6 and triton-cache (held 378 s),
# surface-start 1380 .gpu7 and surface-wait 560 in one call ran past the call's 600 s (the start took 66 s: start +
# wait must stay under 600) and brought back the file as it was (#24, MTP, expected 329 s, not done). The next
# surface-wait 540 never answered: the machine was taken back for other work mid-call, and what it had recorded was
# lost with it.
# Seen 2026-12-06 (s37): the session began with 168 s of device time, too little to start a machine;
# nothing ran.
# Seen 2026-12-06 (s38): four refused starts (478 s: two asking no kind, two nvidia-h200 after the first refusal
# made it the plain kind), each try after status showed no none_now; then an H100 on a call naming no kind. stage
# 1..6 and triton-cache (held 502 s, counting the refusals), surface-start 1240 .gpu7 --only 42,43,44,24,... with
# surface-wait 470 in one call (190 s: install 28 s, #42 done), then surface-wait 540, 540, 540, 420, 240 and 30:
# seven of the Marlin file (#42-#44, #24-#27), 130-257 s each; the last wait ended at held 1,760 s with 39 s left.
# Seen 2026-12-06 (s39): eight refused starts (747 s: nvidia-h200, nvidia-h100-x1 and calls naming no kind, over 50
# minutes, each after status showed no none_now), then an H100 on a call naming no kind. stage 1..6 and triton-cache
# (held 775 s, counting the refusals), surface-start 940 .gpu7 --again 43,1 with surface-wait 480 in one call (233 s:
# install 39 s, #43 measured again), then surface-wait 540, 540 and 290: #1 again, #28 and #29 (both refused, both
# failed for memory, two boots each, 266 and 227 s); the recorder stopped with 97 s of --stop-after left.
# Seen 2026-12-07 (s40): twelve refused starts (00:58-01:57, then ~02:48, ~02:51, ~03:00 and ~03:05: nvidia-h200,
# nvidia-h100-x1 and calls naming no kind, each after status showed no none_now) cost 1,351 s; stopped with 449 s
# left, too little for a fresh machine without the Triton cache (a fresh checkout lacks .triton/, .gpu*/ and .whl/:
# fetch-wheels.sh made .gpu1-.gpu6 in 47 s; .gpu6 was then split into .gpu6 and .gpu7 (18 MiB) so that .gpu7, .whl (19
# MiB) and the tree (11 MiB) travel together; fetch-wheels.sh now makes that split itself: .gpu6 21 MiB, .gpu7 20 MiB,
# in 56 s). Nothing recorded.
# Seen 2026-12-07 (s41): the first call (no kind) got an H100 at once, held 27 s. stage 1..6 (held 49 s), no Triton
# cache to carry (the checkout had none); two surface-start calls refused to record ("--again: #30 is not recorded
# yet": to_repeat read no --again as all of the plan, fixed in e77c469), then surface-start 1550 .gpu7 with
# surface-wait 480 in one call (241 s: #30, Triton compiled cold, 237 s), surface-wait 540 x6 and 265: ten of the
# Marlin file (#30-#39, 19-237 s each); the recorder stopped itself at held 1,704 s (#40 expected 130 s), 95 s left.
# Seen 2026-12-07 (s42): two refused starts (271 s; a third call during a none_now cost nothing), then an H100 on a
# call naming no kind, held 399 s at its first answer; stage 1..6 and triton-cache (held 419 s), surface-start 1270
# .gpu7 with surface-wait 470 in one call (install 28 s, #40), surface-wait 540 (#41: the Marlin file complete at 45),
# then surface-start ... --again 44,43,1 (only #44: --again subtracts the repeats a file holds), --again 43,43,1,1
# (#43 and #1 a third time) and --again 42,35, each with its waits: 103-151 s a configuration; --again 36 was refused
# by the recorder (240 s left, 322 s expected). Given back at held 1,497 s.
# Seen 2026-12-07 (s43): the first call (no kind) got an H100 at once, held 84 s. stage 1..6 and triton-cache (held
# 105 s), then three `surface-start N .gpu7 --again ... && sleep 3 && surface-wait 470` calls, each followed by
# surface-wait 540 calls back to back: --again 36,36,9,9 (#36 cold 147 s, then warm 79 s; #9 cold 135 s, warm 97 s),
# --again 44,44,44,42,42,42 (four: --again subtracts the two each file held; #42's cold boot, given 104 blocks, died
# for memory at c=32 and was booted again warm, 222 s in all), --again 43 x5 and 1 x5 (#43 three times, then the
# recipe once; the recorder stopped itself with 90 s of --stop-after left): twelve repeats, 79-222 s each. Given
# back at held 1,637 s (163 s left).
# Next: the Marlin file is complete; on an H100, `--again I,I` measures recorded ones once more (its repeats). On an
# H200 (its own surface, #19-#41 to go), stage 1..6 and triton-cache, then `surface-start <left-40> .gpu7`. A start and its first wait can share one call
# (`surface-start N .gpu7 ... && sleep 3 && surface-wait 480`: under 600 s together); each surface-wait now returns
# once a configuration is recorded, so a machine taken back loses one at most.
#   1-4: bash benchmarks/h200/run_h200.sh stage 1   ... stage 4         carry [".gpuN"]
#   5:   bash benchmarks/h200/run_h200.sh trials                          carry [".gpu5", ".whl"]
#        (stages .gpu5 and .whl, installs, reads the idle card, then: `autotune trial --memory-cap 24` of vLLM's
#         defaults, which must fail and be classified, and two eager trials capped to 24 GiB)
#   6:   bash benchmarks/h200/run_h200.sh study                           (`autotune run` of smoke-study.toml,
#         2 booted trials, one with CUDA graphs; status; export)
#   or 6, 7, 8 ...: bash benchmarks/h200/run_h200.sh chat                 (the chat study as a 3090, resumed call
#         after call; chat.db comes back in $OUT)
#   or 5: bash benchmarks/h200/run_h200.sh chat-start SECONDS .gpu5       carry [".gpu5", ".whl"]
#      (the tree and what a call carries must stay under 64 MiB: with the tree at 3.9 MiB, a 60 MiB part is refused;
#       then split the wheel and .gpu5 into more, smaller folders, stage all but the last, carry that one here)
#      6, 7 ...: bash benchmarks/h200/run_h200.sh chat-wait 560            (one study of SECONDS across calls)
#   or N: bash benchmarks/h200/run_h200.sh surface-start SECONDS .gpuN    carry [".gpuN", ".whl"]
#      N+1 ...: bash benchmarks/h200/run_h200.sh surface-wait 560          (the GPU response surface of issue 15:
#       benchmarks/record_surface.py's docstring has its runbook)
#      With SURFACE unset the card picks the file: an H200 resumes h200-as-rtx3090-awq/surface.json (the flags as planned), an
#      H100 resumes h100-as-rtx3090-awq-marlin/surface.json with --ballast and Machete disabled: the same plan on the
#      card held down to the capped card's CUDA total, booting autotune's own flags, its AWQ weights as a 3090's
#      (does a real 24 GiB card run what autotune boots? s27: not the flags as planned, h100-as-rtx3090-awq-capture-pinned/surface.json;
#      s28-s29, with Machete, h100-as-rtx3090-awq-machete/surface.json: 17, the estimator right once it modelled MTP's
#      drafter). So whichever card comes records a point of one of the two; --only I,J picks which.
#      Before surface-start on a fresh machine: `triton-cache` carry [".triton"] (the cache a surface-wait brought
#      back, kept in .triton/triton-cache.tgz) spares the first configuration Triton's compile.
# Each phase leaves $OUT/<phase>.tgz: server logs, NVML and nvidia-smi series, results-raw.json.
# Then, here: python -m benchmarks.h200.collect_h200 <folders the tgz files were unpacked into>
#   -> benchmarks/data/h200-cuda-boots/results.json.
# What to know: set VLLM_USE_FLASHINFER_SAMPLER=0 and --gdn-prefill-backend triton (FlashInfer is not carried);
# the first boot on a fresh machine is cold (torch.compile, Triton JIT) and its memory figures are not the
# configuration's; boots take about 1-2.5 min eager and about 4 min with CUDA graphs: plan the 30-minute device
# budget around three or four boots.
set -uo pipefail
phase=$1
here=$(cd "$(dirname "$0")" && pwd)
export GPURUN=/tmp/gpurun PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
mkdir -p /tmp/acc "$GPURUN"
# the GPU response surface, resumed across sessions (benchmarks/data/ in the tree); another name for another
# recording of the plan, e.g. SURFACE=h100-as-rtx3090-awq-machete/surface.json with the recorder's --ballast
# Left unset, the card picks: the H200 surface resumes only on an H200 (the recorder refuses another card), so an
# H100 records the same plan held down to the capped card's total with autotune's own flags (--ballast) instead,
# and since s29 with Machete disabled, so that 4-bit AWQ takes the memory it takes on a 3090 (Marlin: 0.34 GiB less
# for this model): h100-as-rtx3090-awq-marlin/surface.json (h100-as-rtx3090-awq-machete/surface.json holds s28-s29's 17 with it).
# PLAN (in benchmarks/data/) is the plan recorded: rtx3090-surface-plan/awq.json unless set, e.g.
# PLAN=rtx3090-surface-plan/gptq.json (benchmarks/surface_plan.py --checkpoint: four of the plan served from the
# GPTQ-Int4 checkpoint the 3090 study starts from), whose surface is then the same name with the plan's suffix
# (h100-as-rtx3090-gptq-marlin/surface.json on an H100). Give it to surface-start and to each surface-wait.
PLAN=${PLAN:-rtx3090-surface-plan/awq.json}
checkpoint=$(basename "$PLAN" .json)
BALLAST=()
if [ -z "${DATASET:-}" ]; then
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H100*) DATASET=h100-as-rtx3090-$checkpoint-marlin BALLAST=(--ballast)
            export VLLM_DISABLED_KERNELS=MacheteLinearKernel ;;  # 4-bit held as on a 3090 (Marlin), not Machete
    *) DATASET=h200-as-rtx3090-$checkpoint ;;
  esac
  echo "dataset: $DATASET ${BALLAST[*]} (plan $PLAN)"
fi
SURFACE=$GPURUN/$DATASET/surface.json
LOGS=$GPURUN/$DATASET/logs/$(date -u +%Y-%m-%dT%H%M)
CACHE=$HOME/.cache/autotune/vllm  # autotune's compile cache (autotune/engine/compile_cache.py), Triton's under it

install() {  # FOLDER: stage the last wheel folder and .whl, install into /tmp/site (once), copy the tree to /tmp/src
  if [ -f /tmp/site/.autotune-installed ]; then
    echo "installed already (a surface-start before on this machine)"
  else
    cp "$1"/* .whl/*.whl /tmp/acc/
    bash "$here/device-install.sh" | tail -3 && touch /tmp/site/.autotune-installed
    echo "installed after ${SECONDS}s"
  fi
  rm -rf /tmp/src && mkdir -p /tmp/src
  tar cf - --exclude='./.gpu*' --exclude=./.whl --exclude=./.git . | tar xf - -C /tmp/src
  (cd /tmp/src && python3 -c "import os; from autotune.engine.server import EngineSpec, server_env
os.environ.update({k: v for k, v in server_env(EngineSpec('m'), {}).items() if 'TRITON' in k})
import triton; from triton.runtime.cache import get_cache_manager
print('triton', triton.__version__, 'cache', get_cache_manager('ab12').cache_dir)") || exit 3
}

launch() {  # NAME COMMAND...: COMMAND from /tmp/src in its own session (it outlives the call), to $GPURUN/NAME.out
  local name=$1; shift
  (cd /tmp/src && setsid nohup "$@" >"$GPURUN/$name.out" 2>&1 </dev/null &)
  sleep 20; tail -5 "$GPURUN/$name.out"; echo "started after ${SECONDS}s"
}

wait_for() {  # PATTERN SECONDS [FILE]: wait up to SECONDS while a process matches PATTERN (and FILE, if given, is
  # as it was), then say whether it ended
  local end=$((SECONDS + $2)) was
  was=$(stat -c %Y "${3:-/dev/null}" 2>/dev/null)
  while [ $SECONDS -lt $end ] && pgrep -f "$1" >/dev/null; do
    if [ -n "${3:-}" ] && [ "$(stat -c %Y "$3" 2>/dev/null)" != "$was" ]; then echo "$3 rewritten"; break; fi
    sleep 5
  done
  pgrep -f "$1" >/dev/null && echo "still running" || echo "finished"
}

case $phase in
  stage)
    cp ".gpu$2"/* /tmp/acc/ && ls /tmp/acc | wc -l ;;
  trials)
    cp .gpu5/* .whl/*.whl /tmp/acc/
    bash "$here/device-install.sh" | tail -3
    echo "installed after ${SECONDS}s"
    python3 -m benchmarks.h200.run_h200 idle 2>&1 | tail -8
    timeout -k 10 $((575 - SECONDS)) python3 -m benchmarks.h200.run_h200 trials 2>&1 | tee "$GPURUN/trials.out" | grep -v '^\[' | tail -40
    tar czf "$OUT/trials.tgz" -C "$GPURUN" . ;;
  study)
    timeout -k 10 $((580 - SECONDS)) python3 -m benchmarks.h200.run_h200 study 2>&1 | tee "$GPURUN/study.out" | tail -60
    tar czf "$OUT/study.tgz" -C "$GPURUN" . ;;
  chat)
    # The issue 13/14 proof: `autotune run` of tests/data/gpu/chat-as-3090.toml (H200 capped as an RTX 3090, CUDA
    # graphs, objectives/chat-p95.toml), one call at a time, each resuming the study in $GPURUN/chat.db; the run's
    # budget is what the call has left less the longest trial (~5 min). Bring chat.db back from $OUT and carry it
    # in as CHAT_DB to resume in a later session (the compile cache is not carried: a fresh machine boots cold).
    python3 -m benchmarks.h200.run_h200 chat $((575 - SECONDS - 300)) 2>&1 | tee -a "$GPURUN/chat.out" | tail -60
    cp "$GPURUN/chat.db" "$OUT/" 2>/dev/null
    tar czf "$OUT/chat.tgz" -C "$GPURUN" --exclude chat.db . ;;
  chat-start)
    # One study across calls (better than `chat` once per call): installs (the last wheel folder $3 and .whl),
    # then starts `autotune run --budget $2` in the background. Follow it with `chat-wait` calls, back to back.
    install "$3"
    launch chat python3 -m benchmarks.h200.run_h200 chat "$2" ;;
  chat-wait)
    # Waits up to $2 s for the run chat-start began, then brings back chat.db, its output and the server logs.
    wait_for "benchmarks.h200.run_h200 chat" "$2"
    grep -v '^\[' "$GPURUN/chat.out" | tail -40
    cp "$GPURUN/chat.db" "$OUT/" 2>/dev/null
    tar czf "$OUT/chat.tgz" -C "$GPURUN" --exclude chat.db --exclude ./qwen3.5-27b-awq-dummy . ;;
  surface-start)
    # The GPU response surface across calls: installs (the last wheel folder $3 and .whl), then records the
    # planned configurations for $2 s in the background. It resumes the surface a previous start on this machine
    # left in $GPURUN, else the one the tree carries in benchmarks/data/ (a later session's), else starts one.
    # First it prints what the configurations to go are expected to cost (--estimate: boots nothing).
    # Further arguments go to the recorder, e.g. `--only 42,9 --ballast` with SURFACE=h100-as-rtx3090-awq-machete/surface.json.
    install "$3"
    mkdir -p "$(dirname "$SURFACE")"
    [ -f "$SURFACE" ] || cp "benchmarks/data/$DATASET/surface.json" "$SURFACE" 2>/dev/null
    (cd /tmp/src && python3 -m benchmarks.record_surface --plan "benchmarks/data/$PLAN" \
      --out "$SURFACE" --estimate "${BALLAST[@]}" | tail -4)
    launch surface python3 -m benchmarks.record_surface --plan "benchmarks/data/$PLAN" \
      --out "$SURFACE" --logs "$LOGS" --stop-after "$2" "${BALLAST[@]}" "${@:4}" ;;
  surface-wait)
    # Waits up to $2 s for the recording surface-start began, or until it rewrites the surface file (after every
    # configuration), then brings back the file, the recorder's output and the server logs: each configuration comes
    # back with the call it was recorded in (s36: a machine taken back mid-call returns nothing of that call).
    # The surface as it stands goes back first: a call cut off by the session's end still returns it.
    cp "$SURFACE" "$OUT/" 2>/dev/null
    wait_for "benchmarks.record_surface" "$2" "$SURFACE"
    tail -30 "$GPURUN/surface.out"
    cp "$SURFACE" "$OUT/" 2>/dev/null
    tar czf "$OUT/surface.tgz" -C "$GPURUN" surface.out "$DATASET/logs"
    # The session's first key compiles Triton's kernels (s22: 263 s against 55-141 s for later cold boots); the
    # Triton cache goes back (under 40 MiB) to be carried into the next session's machine with `triton-cache`.
    du -sh "$CACHE"/* /tmp/torchinductor_* 2>/dev/null
    # (s24: 79 MiB unpacked; kept where it compresses under 40 MiB)
    [ -d "$CACHE/triton" ] && tar czf "$OUT/triton-cache.tgz" -C "$CACHE" triton \
      && ls -l "$OUT/triton-cache.tgz" && [ "$(du -sm "$OUT/triton-cache.tgz" | cut -f1)" -lt 40 ] \
      || rm -f "$OUT/triton-cache.tgz" ;;
  triton-cache)
    # carry [".triton"]: the Triton cache a previous session's surface-wait brought back (.triton/triton-cache.tgz)
    mkdir -p "$CACHE" && tar xzf .triton/triton-cache.tgz -C "$CACHE" && du -sh "$CACHE/triton" ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac

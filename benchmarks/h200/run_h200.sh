#!/usr/bin/env bash
# The GPU device runbook's one entry point: `bash benchmarks/h200/run_h200.sh PHASE [ARGS]`, in the repository
# root on the rented machine. benchmarks/h200/README.md says what each phase does, what each call carries and how
# what comes back under $OUT enters the catalogue (benchmarks/data/).
set -uo pipefail
phase=$1
here=$(cd "$(dirname "$0")" && pwd)
# VLLM_VERSION picks the vLLM release: 0.25.0 (the image's torch 2.11) lives in /tmp/site, another in
# /tmp/site-VERSION with its own torch (fetch-wheels.sh VERSION, then stage NN and install-version).
VLLM_VERSION=${VLLM_VERSION:-0.25.0}
SITE=/tmp/site; [ "$VLLM_VERSION" = 0.25.0 ] || SITE=/tmp/site-$VLLM_VERSION
export GPURUN=/tmp/gpurun PYTHONPATH=$SITE PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
mkdir -p /tmp/acc "$GPURUN"
# A response surface (surface-start, surface-wait) resumes a dataset of benchmarks/data/ (DATASET, a folder name).
# Left unset, the card picks: an H200 records the plan capped as a 3090 (h200-as-rtx3090-PLAN; the recorder refuses
# to resume a surface on another card), an H100 records it held down to the capped card's CUDA total (--ballast)
# with Machete disabled, so that 4-bit weights take the memory they take on a 3090 (h100-as-rtx3090-PLAN-marlin).
# PLAN (in benchmarks/data/) is the plan recorded: rtx3090-surface-plan/awq.json unless set, e.g.
# PLAN=rtx3090-surface-plan/gptq.json (four of the plan served from the GPTQ-Int4 checkpoint). Give the same
# PLAN and DATASET to surface-start and to each surface-wait.
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
    if [ "$VLLM_VERSION" = 0.25.0 ]; then cp ".gpu$2"/* /tmp/acc/ && ls /tmp/acc | wc -l
    else mkdir -p "/tmp/acc-$VLLM_VERSION" && cp ".gpu-$VLLM_VERSION-$2"/* "/tmp/acc-$VLLM_VERSION/" \
      && ls "/tmp/acc-$VLLM_VERSION" | wc -l; fi ;;
  install-version)
    # after every piece of .gpu-VERSION-NN was staged: install that release into /tmp/site-VERSION
    bash "$here/device-install.sh" "$VLLM_VERSION" 2>&1 | tail -5; echo "installed after ${SECONDS}s" ;;
  boots-start)
    # Ground truth for the memory estimator: benchmarks/h200/boot_matrix.py boots the plan $3 (a JSON file in the
    # tree) one configuration after another for $2 s in the background, into $GPURUN/boots. Then boots-wait calls.
    # Further arguments go to boot_matrix.py, e.g. `--only NAME,NAME`.
    rm -rf /tmp/src && mkdir -p /tmp/src "$GPURUN/boots"
    tar cf - --exclude='./.gpu*' --exclude=./.whl --exclude=./.git . | tar xf - -C /tmp/src
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
    export VLLM_LOGGING_LEVEL=DEBUG
    launch boots python3 -m benchmarks.h200.boot_matrix "$3" "$GPURUN/boots" --seconds "$2" "${@:4}" ;;
  boots-wait)
    # waits up to $2 s or until boots.json is rewritten (after every boot), then brings back boots.json and the logs
    wait_for "benchmarks.h200.boot_matrix" "$2" "$GPURUN/boots/boots.json"
    grep -v '^\[' "$GPURUN/boots.out" | tail -20
    cp "$GPURUN/boots/boots.json" "$OUT/" 2>/dev/null
    tar czf "$OUT/boots-logs.tgz" -C "$GPURUN/boots" logs "../boots.out" 2>/dev/null ;;
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
    # `autotune run` of tests/data/gpu/chat-as-3090.toml (H200 capped as an RTX 3090, CUDA graphs,
    # objectives/chat-p95.toml), one call at a time, each resuming the study in $GPURUN/chat.db; the run's budget is
    # what the call has left less the longest trial (~5 min). Bring chat.db back from $OUT and carry it in as
    # CHAT_DB to resume on another machine (the compile cache is not carried: a fresh machine boots cold).
    python3 -m benchmarks.h200.run_h200 chat $((575 - SECONDS - 300)) 2>&1 | tee -a "$GPURUN/chat.out" | tail -60
    cp "$GPURUN/chat.db" "$OUT/" 2>/dev/null
    tar czf "$OUT/chat.tgz" -C "$GPURUN" --exclude chat.db . ;;
  chat-start)
    # One study across calls (better than `chat` once per call): installs (the last wheel folder $3 and .whl),
    # then starts `autotune run --budget $2` in the background; given $4, `autotune compare` follows with what is
    # left of $4 s from the start, less a minute. Follow it with `chat-wait` calls, back to back.
    install "$3"
    launch chat python3 -m benchmarks.h200.run_h200 chat "$2" ${4:+"$4"} ;;
  chat-wait)
    # Waits up to $2 s for the run chat-start began, then brings back chat.db, its output and the server logs.
    wait_for "benchmarks.h200.run_h200 chat" "$2"
    grep -v '^\[' "$GPURUN/chat.out" | tail -40
    cp "$GPURUN/chat.db" "$OUT/" 2>/dev/null
    tar czf "$OUT/chat.tgz" -C "$GPURUN" --exclude chat.db --exclude ./qwen3.5-27b-awq-dummy . ;;
  surface-start)
    # The GPU response surface across calls: installs (the last wheel folder $3 and .whl), then records the
    # planned configurations for $2 s in the background. It resumes the surface a previous start on this machine
    # left in $GPURUN, else the one the tree carries in benchmarks/data/$DATASET/, else starts one.
    # First it prints what the configurations to go are expected to cost (--estimate: boots nothing).
    # Further arguments go to the recorder, e.g. `--only 42,9` or `--again 43,1`.
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
    # back with the call it was recorded in (a machine taken back mid-call returns nothing of that call).
    # The surface as it stands goes back first: a call cut off by the machine's end still returns it.
    cp "$SURFACE" "$OUT/" 2>/dev/null
    wait_for "benchmarks.record_surface" "$2" "$SURFACE"
    tail -30 "$GPURUN/surface.out"
    cp "$SURFACE" "$OUT/" 2>/dev/null
    tar czf "$OUT/surface.tgz" -C "$GPURUN" surface.out "$DATASET/logs"
    # A fresh machine's first key compiles Triton's kernels (263 s against 55-141 s for later cold boots); the
    # Triton cache goes back (under 40 MiB) to be carried into the next machine with `triton-cache`.
    du -sh "$CACHE"/* /tmp/torchinductor_* 2>/dev/null
    # (79 MiB unpacked; kept where it compresses under 40 MiB)
    [ -d "$CACHE/triton" ] && tar czf "$OUT/triton-cache.tgz" -C "$CACHE" triton \
      && ls -l "$OUT/triton-cache.tgz" && [ "$(du -sm "$OUT/triton-cache.tgz" | cut -f1)" -lt 40 ] \
      || rm -f "$OUT/triton-cache.tgz" ;;
  triton-cache)
    # carry [".triton"]: the Triton cache an earlier machine's surface-wait brought back (.triton/triton-cache.tgz)
    mkdir -p "$CACHE" && tar xzf .triton/triton-cache.tgz -C "$CACHE" && du -sh "$CACHE/triton" ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac

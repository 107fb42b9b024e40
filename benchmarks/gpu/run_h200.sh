#!/usr/bin/env bash
# The device run of issue 8 on the lent H200 (see ../shared/gpu/README.md for the vLLM 0.25.0 wheels).
#
# Here, once: echo '/.gpu*/' >> .git/info/exclude; echo '/.whl/' >> .git/info/exclude
#             bash ../shared/gpu/fetch-wheels.sh            # -> .gpu1 ... .gpu5
#             pip download optuna==5.1.0 sqlalchemy==2.1.9 alembic==1.20.1 colorlog==6.12.0 mako==1.4.3 into .whl
#             (--no-deps --only-binary=:all: --python-version 3.12 --platform manylinux...: the device lacks them)
# Device calls, back to back on one warm machine (each carries one folder; /tmp survives between them):
#   1-4: bash benchmarks/gpu/run_h200.sh stage 1   ... stage 4          carry [".gpuN"]
#   5:   bash benchmarks/gpu/run_h200.sh trials                           carry [".gpu5", ".whl"]
#        (stages .gpu5 and .whl, installs, reads the idle card, then: `autotune trial --memory-cap 24` of vLLM's
#         defaults, which must fail and be classified, and two eager trials capped to 24 GiB)
#   6:   bash benchmarks/gpu/run_h200.sh study                            (`autotune run` of smoke-study.toml,
#         2 booted trials, one with CUDA graphs; status; export)
# Each phase leaves $OUT/<phase>.tgz: server logs, NVML and nvidia-smi series, results-raw.json.
# Then, here: python benchmarks/gpu/collect_h200.py <folders the tgz files were unpacked into> -> results-h200.json.
# Until autotune/study.py applies memory_cap_gib itself, the study phase needs benchmarks/gpu/study-memcap.patch:
# the 2026-12-02 run used a copy of the tree with it applied (cp -r autotune benchmarks .gpusnap/, patch there,
# carry ".gpusnap", run .gpusnap/benchmarks/gpu/run_h200.sh) so that the tree others were editing did not travel.
set -uo pipefail
phase=$1
here=$(cd "$(dirname "$0")" && pwd)
export GPURUN=/tmp/gpurun PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
mkdir -p /tmp/acc "$GPURUN"
case $phase in
  stage)
    cp ".gpu$2"/* /tmp/acc/ && ls /tmp/acc | wc -l ;;
  trials)
    cp .gpu5/* .whl/*.whl /tmp/acc/
    cd /tmp/acc
    if ls vllm-part.* >/dev/null 2>&1; then cat $(ls vllm-part.* | sort) > /tmp/vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl; rm -f vllm-part.*; fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      /tmp/vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl /tmp/acc/*.whl 2>&1 | grep -v 'already exists' | tail -3
    cd - >/dev/null
    echo "installed after ${SECONDS}s"
    python3 "$here/run_h200.py" idle 2>&1 | tail -8
    timeout -k 10 $((575 - SECONDS)) python3 "$here/run_h200.py" trials 2>&1 | tee "$GPURUN/trials.out" | grep -v '^\[' | tail -40
    tar czf "$OUT/trials.tgz" -C "$GPURUN" . ;;
  study)
    timeout -k 10 $((580 - SECONDS)) python3 "$here/run_h200.py" study 2>&1 | tee "$GPURUN/study.out" | tail -60
    tar czf "$OUT/study.tgz" -C "$GPURUN" . ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac

#!/usr/bin/env bash
# Download vLLM 0.25.0 (CUDA 13 build, matching the device image's torch 2.11.0+cu130) and the pure-Python and
# small native packages it needs that the device image lacks, then split them into carry folders of at most
# 50 MiB each: .gpu1 ... .gpuN in the current directory (the repository's .gitignore ignores /.gpu*/).
# Usage: bash benchmarks/h200/fetch-wheels.sh [VERSION]  (run in the repository root; see run_h200.sh)
# VERSION other than 0.25.0 (e.g. 0.32.0, which needs torch 2.13.0 and triton 3.7.1 beside the image's torch 2.11):
# every wheel of wheels-vllm-VERSION.txt goes into one tar split into 50 MiB pieces, .gpu-VERSION-01 ... -NN.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=${1:-0.25.0}
dl=$(mktemp -d)
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_26_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_35_x86_64)
while read -r req; do
  [ -n "$req" ] || continue
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d "$dl" "$req" 2>&1 | grep -v '^WARNING' || true
done < "$here/wheels-vllm-$version.txt"
if [ "$version" != 0.25.0 ]; then
  rm -rf ".gpu-$version-"*
  tar cf "$dl/all.tar" -C "$dl" $(cd "$dl" && ls *.whl)
  split -b 52428800 -d -a 2 --numeric-suffixes=1 "$dl/all.tar" "$dl/part."
  for p in "$dl"/part.*; do d=".gpu-$version-${p##*.}"; mkdir -p "$d"; mv "$p" "$d/"; done
  du -shc ".gpu-$version-"* | tail -1; ls -d ".gpu-$version-"* | tail -1
  echo "carry each .gpu-$version-NN in turn (run_h200.sh stage NN with VLLM_VERSION=$version), then install"
  exit 0
fi
rm -rf .gpu[0-9]*
n=1; mkdir -p .gpu1
# the big vLLM wheel goes in 50 MiB pieces (a call carries the tree too, ~4 MiB, under 64 MiB in all: a 60 MiB
# piece was refused), the rest fill folders of at most 50 MiB
vw=$(ls "$dl"/vllm-0.25.0-*.whl)
split -b 52428800 -d -a 1 "$vw" "$dl/vllm-part."
rm "$vw"
for p in "$dl"/vllm-part.*; do mkdir -p ".gpu$n"; mv "$p" ".gpu$n/"; n=$((n + 1)); done
mkdir -p ".gpu$n"
for w in $(ls -S "$dl"/*.whl); do
  if [ $(( $(du -sm ".gpu$n" | cut -f1) + $(du -m "$w" | cut -f1) )) -gt 50 ]; then n=$((n + 1)); mkdir -p ".gpu$n"; fi
  mv "$w" ".gpu$n/"
done
# the last folder travels with .whl (~19 MiB) and the tree (~11 MiB) in one call (surface-start): keep it to 20 MiB,
# moving the largest wheels that fit into one more folder (a 41 MiB .gpu6 once had to be split by hand)
if [ "$(du -sm ".gpu$n" | cut -f1)" -gt 20 ]; then
  mkdir -p ".gpu$((n + 1))"
  for w in $(ls -S ".gpu$n"); do
    if [ $(( $(du -sm ".gpu$((n + 1))" | cut -f1) + $(du -m ".gpu$n/$w" | cut -f1) )) -le 20 ]; then
      mv ".gpu$n/$w" ".gpu$((n + 1))/"
    fi
  done
  n=$((n + 1))
fi
du -sh .gpu*
echo "carry .gpu1 ... .gpu$n, one folder per device call, each copying it to /tmp/acc; then bash benchmarks/h200/device-install.sh"

#!/usr/bin/env bash
# Download vLLM 0.25.0 (CUDA 13 build, matching the device image's torch 2.11.0+cu130) and the pure-Python and
# small native packages it needs that the device image lacks, then split them into carry folders of at most
# 50 MiB each: .gpu1 ... .gpuN in the current directory (the repository's .gitignore ignores /.gpu*/).
# Usage: bash benchmarks/h200/fetch-wheels.sh            (run in the repository root; see run_h200.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dl=$(mktemp -d)
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_26_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_35_x86_64)
while read -r req; do
  [ -n "$req" ] || continue
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d "$dl" "$req" 2>&1 | grep -v '^WARNING' || true
done < "$here/wheels-vllm-0.25.0.txt"
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

#!/usr/bin/env bash
# On the device, after every .gpuN folder has been copied to /tmp/acc by earlier calls of the same warm machine:
# reassemble the vLLM wheel and install everything into /tmp/site. Then use PYTHONPATH=/tmp/site.
# Usage: bash benchmarks/h200/device-install.sh [VERSION]  (run_h200.sh's trials phase runs it)
# Another VERSION than 0.25.0: the pieces staged in /tmp/acc-VERSION make one tar of wheels, installed into
# /tmp/site-VERSION (torch and triton included: that version's own, beside the image's).
set -euo pipefail
version=${1:-0.25.0}
if [ "$version" != 0.25.0 ]; then
  mkdir -p "/tmp/wheels-$version" && cd "/tmp/wheels-$version"
  cat $(ls /tmp/acc-"$version"/part.* | sort) | tar xf - && rm -f /tmp/acc-"$version"/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "/tmp/site-$version" \
    ./*.whl 2>&1 | grep -v 'already exists' || true
  python3 -m compileall -q -j 0 "/tmp/site-$version" >/dev/null 2>&1 || true
  PYTHONPATH=/tmp/site-$version python3 -c "import torch, vllm, vllm.entrypoints.openai.api_server
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| vllm', vllm.__version__, 'ready')"
  exit 0
fi
cd /tmp/acc
if ls vllm-part.* >/dev/null 2>&1; then
  cat $(ls vllm-part.* | sort) > /tmp/vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl
  rm -f vllm-part.*
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  /tmp/vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl /tmp/acc/*.whl 2>&1 | grep -v 'already exists' || true
# The device image sets PYTHONDONTWRITEBYTECODE=1 (seen 2026-12-03), so Python never caches what it compiles: with
# --no-compile every vLLM process (two per boot) compiled the sources of vLLM and the packages here again. Seen:
# 24-29 s from each process's start to its first log line, in warm boots too. Compiled once here, the cached
# bytecode is read (that variable only stops writing it).
python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1 || true
PYTHONPATH=/tmp/site python3 -c "import vllm, vllm.entrypoints.openai.api_server; print('vllm', vllm.__version__, 'ready')"

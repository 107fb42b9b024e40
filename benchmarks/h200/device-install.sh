#!/usr/bin/env bash
# On the device, after every .gpuN folder has been copied to /tmp/acc by earlier calls of the same warm machine:
# reassemble the vLLM wheel and install everything into /tmp/site. Then use PYTHONPATH=/tmp/site.
# Usage: bash benchmarks/h200/device-install.sh   (run_h200.sh's trials phase runs it)
set -euo pipefail
cd /tmp/acc
if ls vllm-part.* >/dev/null 2>&1; then
  cat $(ls vllm-part.* | sort) > /tmp/vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl
  rm -f vllm-part.*
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  /tmp/vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl /tmp/acc/*.whl 2>&1 | grep -v 'already exists' || true
PYTHONPATH=/tmp/site python3 -c "import vllm, vllm.entrypoints.openai.api_server; print('vllm', vllm.__version__, 'ready')"

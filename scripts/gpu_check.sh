#!/usr/bin/env bash
# The one GPU call (device tool): carry .whl (transformers 5.24 wheel, see docs/benchmarks.md), then
#   bash scripts/gpu_check.sh
# Installs the wheel into /tmp/site, runs the GPU-relevant tests on CUDA-capable code paths, the device-placement
# checks (scripts/gpu_devices.py: a drafter left on the CPU, prompt ids on the CPU, a split target, compiled
# refinement), then the latency script.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_modeling.py tests/test_generation.py -k "not sampling" 2>&1 | tail -5
timeout 120 python3 scripts/gpu_devices.py 2>&1 | tee "$OUT/devices.log"   # device placements, exact vs plain generate
timeout 380 python3 scripts/gpu_latency.py --out "$OUT/latency.json" 2>&1 | tee "$OUT/latency.log"

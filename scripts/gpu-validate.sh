#!/usr/bin/env bash
# One short, prepared run for a lent GPU machine (device tool): the GPU tier with its defaults --
# the bundled suite on the host's torch with nccl, then a real `stackgate run` with the host's own
# interpreter as production and candidate (the host backend: probed, never modified, no package index
# needed) that must reach GO. Writes its evidence under $OUT (junit, results, reports, logs, nvidia-smi.txt).
set -uo pipefail
OUT=${OUT:-/tmp/stackgate-gpu}
mkdir -p "$OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -m pip install -q --no-deps -e . 2>/dev/null || python3 -m pip install -q -e .
STACKGATE_GPU_OUT="$OUT" python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="" 2>&1 | tee "$OUT/tier.log"

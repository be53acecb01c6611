#!/usr/bin/env bash
# On the H200 image as it is (torch 2.11, pytest-benchmark, jax left in place): the project
# installed without network (its [test] extras that the image lacks come as carried wheels in
# /tmp/site, see install_carried.sh), then the suite a GPU runner runs. Logs under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
python3 -m pip list 2>/dev/null | grep -i -E "^(torch|triton|pytest|pytest-benchmark|pytest-xdist|jax|hypothesis|ml.dtypes|matplotlib|transformer.engine|torchao|gfloat|diffusers|mxcheck) " > "$OUT/gpu_runner_packages.txt"
mxcheck info > "$OUT/mxcheck_info.txt" 2>&1; grep -i -E "transformer_engine|torchao|triton" "$OUT/mxcheck_info.txt"
# One torch thread per worker: 14 workers on 16 cores (the default intra-op pool per worker
# oversubscribes the machine several times over).
OMP_NUM_THREADS=1 timeout "${SUITE_TIMEOUT:-420}" python3 -m pytest -m "cuda or emulated" -n "${WORKERS:-14}" \
    -p no:cacheprovider -v -rfE --mxcheck-report "$OUT/cuda_emulated.json" > "$OUT/cuda_emulated.log" 2>&1
echo "pytest exit $?"; grep -oE "(FAILED|ERROR) tests/[^ ]*" "$OUT/cuda_emulated.log" | sort -u | head -40; tail -4 "$OUT/cuda_emulated.log"

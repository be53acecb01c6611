#!/usr/bin/env bash
# On the H200 image as it is (torch 2.11, pytest-benchmark, jax left in place): the project
# installed without network (its [test] extras that the image lacks come as carried wheels in
# /tmp/site, see install_carried.sh), then the suite a GPU runner runs. Logs under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
python3 -m pip list 2>/dev/null | grep -i -E "^(torch|triton|pytest|pytest-benchmark|pytest-xdist|jax|hypothesis|ml.dtypes|matplotlib|transformer.engine|torchao|gfloat|diffusers|mxcheck) " > "$OUT/gpu_runner_packages.txt"
mxcheck info > "$OUT/mxcheck_info.txt" 2>&1; grep -i -E "transformer_engine|torchao|triton" "$OUT/mxcheck_info.txt"
timeout "${SUITE_TIMEOUT:-420}" python3 -m pytest -m "cuda or emulated" -n 4 -p no:cacheprovider \
    --mxcheck-report "$OUT/cuda_emulated.json" 2>&1 | tee "$OUT/cuda_emulated.log" | tail -25

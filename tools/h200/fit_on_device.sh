#!/usr/bin/env bash
# On the GPU, after install_carried.sh: `mxcheck fit` on each backend where it runs (issue 41 item 4:
# the backend quantizes on its device, the oracle on the CPU), then the quantize check's attribution on
# the same recipe, so the fitted profile can be compared with the cause conformance names.
#   bash tools/h200/fit_on_device.sh torchao:mxfp8 aiter_triton:mxfp4-1x32
set -uo pipefail
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 MXCHECK_AITER_PATH=/tmp/aiter OMP_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2  # the pytest11 entry point
for pair in "$@"; do
    b=${pair%%:*}; r=${pair#*:}
    echo "== mxcheck fit --backend $b --recipe $r"
    timeout "${FIT_TIMEOUT:-240}" python3 -m mxcheck fit --backend "$b" --recipe "$r" \
        --write "$OUT/${b}_${r}_fitted.yaml" 2>&1 | tee "$OUT/${b}_${r}_fit.log" | tail -8
    echo "== quantize check attribution, $b $r"
    timeout "${CONF_TIMEOUT:-240}" python3 -m pytest -m "cuda or emulated" --pyargs mxcheck.conformance.suite \
        -k "quantize and not poison and not edge" -n 0 -p no:cacheprovider -rfE --mxcheck-backend "$b" \
        --mxcheck-recipe "$r" > "$OUT/${b}_${r}_quantize.log" 2>&1
    echo "exit $?"; grep -E "differing blocks examined are reproduced by|no known behaviour" \
        "$OUT/${b}_${r}_quantize.log" | cut -c1-220 | head -8
    echo "== the fitted recipe file gates on the residual alone"
    timeout "${CONF_TIMEOUT:-240}" python3 -m pytest -m "cuda or emulated" --pyargs mxcheck.conformance.suite \
        -k "quantize and not poison and not edge" -n 0 -p no:cacheprovider -q --mxcheck-backend "$b" \
        --mxcheck-recipe "$OUT/${b}_${r}_fitted.yaml" 2>&1 | tail -3
done

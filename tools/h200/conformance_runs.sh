#!/usr/bin/env bash
# On the H200, after install_carried.sh: the installed conformance suite (mxcheck.conformance.suite,
# as users run it) for each real third-party backend; one JSON report and one log per backend under $OUT.
#   bash tools/h200/conformance_runs.sh transformer_engine aiter_triton torchao
set -uo pipefail
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 MXCHECK_AITER_PATH=/tmp/aiter OMP_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2  # the pytest11 entry point
files="--pyargs mxcheck.conformance.suite"
for b in "$@"; do
    extra=""; [ "$b" = aiter_triton ] && extra=tests/test_aiter_triton_backend.py
    timeout "${CONF_TIMEOUT:-240}" python3 -m pytest -m "cuda or emulated" $files $extra -n "${WORKERS:-12}" \
        -p no:cacheprovider -v -rfE --mxcheck-backend "$b" --mxcheck-report "$OUT/${b}_conformance.json" \
        > "$OUT/${b}_conformance.log" 2>&1
    echo "== $b: exit $?"; grep -E "^(FAILED|ERROR) " "$OUT/${b}_conformance.log" | cut -c1-200 | head -25
    tail -2 "$OUT/${b}_conformance.log"
done

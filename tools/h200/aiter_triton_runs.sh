#!/usr/bin/env bash
# On the H200, after install_carried.sh: AITER's Triton MXFP4 kernels (the aiter_triton backend,
# files from .te/aiter.tgz unpacked in /tmp/aiter) through conformance and the Flux 12B sweep.
set -uo pipefail
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 MXCHECK_AITER_PATH=/tmp/aiter
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
python3 -c "from mxcheck.backends import get; print('aiter_triton available:', get('aiter_triton').available())"
timeout "${CONF_TIMEOUT:-300}" python3 -m pytest -m "cuda or emulated" tests/conformance tests/test_aiter_triton_backend.py \
    -n 8 -p no:cacheprovider -v -rfE --mxcheck-backend aiter_triton --mxcheck-report "$OUT/aiter_triton_conformance.json" \
    > "$OUT/aiter_triton_conformance.log" 2>&1
echo "conformance exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/aiter_triton_conformance.log" | cut -c1-220 | head -30
tail -3 "$OUT/aiter_triton_conformance.log"
timeout "${SWEEP_TIMEOUT:-150}" mxcheck sweep --model flux-12b --mbs 16 --backend aiter_triton \
    --recipes mxfp4-1x32 mxfp4 --out "$OUT/sweep_aiter_triton" 2>&1 | tail -12

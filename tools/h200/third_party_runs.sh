#!/usr/bin/env bash
# On the H200, after gpu_runner_suite.sh: conformance and the Flux 12B sweep for the real
# third-party backends (TransformerEngine, torchao). Reports under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -m "cuda or emulated" tests/conformance -n 4 -p no:cacheprovider \
    --mxcheck-backend transformer_engine --mxcheck-report "$OUT/te_conformance.json" 2>&1 \
    | tee "$OUT/te_conformance.log" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -25
for b in transformer_engine torchao; do
    recipes="fp8 fp8-hybrid fp8-delayed fp8-block"
    [ "$b" = torchao ] && recipes="mxfp8 mxfp4-1x32 fp8 fp8-hybrid fp8-rowwise"
    timeout 150 mxcheck sweep --model flux-12b --mbs 16 --backend "$b" --recipes $recipes --out "$OUT/sweep_$b" \
        2>&1 | tail -12
done

#!/usr/bin/env bash
# On the H200: py-spy over a quantized linear's loop and the flux-535m step, per recipe, once
# warm (Triton compiled); the summaries to $OUT/host_spy.log, the raw stacks in
# $OUT/spy_raw.tar.gz. After fused_runs.sh has filled /tmp/site from the carried .whl/, which
# must hold py-spy (`pip download py-spy --only-binary=:all: --platform manylinux2014_x86_64`).
set -uo pipefail
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
SPY=/tmp/site/bin/py-spy
mkdir -p /tmp/spy
for what in ${SPY_RUNS:-linear:bf16 linear:mxfp4 linear:nvfp4 step:bf16 step:mxfp4 step:nvfp4}; do
    kind=${what%%:*} recipe=${what##*:}
    flag=$([ "$kind" = step ] && echo --step)
    raw=/tmp/spy/${kind}_$recipe.txt log=/tmp/spy/${kind}_$recipe.log
    python3 tools/h200/linear_host_loop.py $recipe $flag --seconds 60 > $log 2>&1 &
    pid=$!
    for _ in $(seq 120); do grep -q warm $log && break; sleep 0.5; done
    timeout 30 $SPY record --pid $pid --duration ${SPY_SECONDS:-5} --nonblocking -r ${SPY_RATE:-250} -f raw --threads \
        ${SPY_NATIVE:-} -o $raw > /dev/null 2>&1
    kill $pid; wait $pid 2>/dev/null
    echo "### $kind $recipe" >> $OUT/host_spy.log
    python3 tools/h200/spy_summary.py $raw --within "call (linear_host_loop" "step (bench_training_step" backward \
        --top ${SPY_TOP:-45} >> $OUT/host_spy.log
done
tar czf $OUT/spy_raw.tar.gz -C /tmp spy

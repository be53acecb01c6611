#!/usr/bin/env bash
# On the H200: py-spy over a quantized linear's loop and the flux-535m step, per recipe; the
# summaries to $OUT/host_spy.log, the raw stacks in $OUT/spy_raw.tar.gz. After fused_runs.sh
# (or install_carried) has filled /tmp/site.
set -uo pipefail
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
SPY=/tmp/site/bin/py-spy
mkdir -p /tmp/spy
for what in ${SPY_RUNS:-linear:bf16 linear:mxfp4 linear:nvfp4 step:bf16 step:mxfp4 step:nvfp4}; do
    kind=${what%%:*} recipe=${what##*:}
    flag=$([ "$kind" = step ] && echo --step)
    raw=/tmp/spy/${kind}_$recipe.txt
    timeout 120 $SPY record -r ${SPY_RATE:-1000} -f raw --threads ${SPY_NATIVE:-} -o $raw -- \
        python3 tools/h200/linear_host_loop.py $recipe $flag --seconds ${SPY_SECONDS:-6} 2>&1 | grep -v "^py-spy>" | tail -2
    echo "### $kind $recipe" >> $OUT/host_spy.log
    python3 tools/h200/spy_summary.py $raw --within "call (linear_host_loop" "step (bench_training_step" backward --top ${SPY_TOP:-45} >> $OUT/host_spy.log
done
tar czf $OUT/spy_raw.tar.gz -C /tmp spy

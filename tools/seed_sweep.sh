#!/usr/bin/env bash
# Flake hunt: run every emulated test whose inputs come from --mxcheck-seed
# (--mxcheck-seeded-only; the rest do not change with the seed) under N random seeds; any
# failure prints its seed so it can be replayed with --mxcheck-seed SEED.
#   tools/seed_sweep.sh                       # 20 seeds, the whole suite's seeded tests, -n 2
#   SEEDS=5 tools/seed_sweep.sh tests/conformance -k "sr_ or quantize"
#   PYTEST="python -m pytest" XDIST="-n 0" tools/seed_sweep.sh tests/test_mx.py
#   SEED_LIST="4060103506 3305835275" SEEDS=0 tools/seed_sweep.sh   # replay given seeds (then SEEDS new ones)
set -u
SEEDS=${SEEDS:-20}
PYTEST=${PYTEST:-python -m pytest}
XDIST=${XDIST:--n 2}
[ $# -eq 0 ] && set -- tests
failed=()
seeds=(${SEED_LIST:-})
for _ in $(seq 1 "$SEEDS"); do seeds+=("$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"); done
for seed in "${seeds[@]}"; do
    start=$(date +%s)
    if $PYTEST -m "emulated and not slow" -q -p no:cacheprovider $XDIST --mxcheck-seeded-only --mxcheck-seed "$seed" "$@" >/tmp/seed_sweep_$seed.log 2>&1; then
        echo "seed $seed: ok ($(( $(date +%s) - start ))s) $(tail -1 /tmp/seed_sweep_$seed.log)"
    else
        echo "seed $seed: FAILED ($(( $(date +%s) - start ))s), log /tmp/seed_sweep_$seed.log"
        grep -E '^(FAILED|ERROR)' /tmp/seed_sweep_$seed.log
        failed+=("$seed")
    fi
done
echo "${#seeds[@]} seeds, ${#failed[@]} failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]

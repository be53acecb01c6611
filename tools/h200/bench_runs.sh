#!/usr/bin/env bash
# On the H200, after the carried wheels are in /tmp/site (seed_runs.sh or install_carried.sh):
# issue 15's GPU benchmarks, one JSON and one log each under $OUT. BENCHES picks a subset.
#   BENCHES="training quantize memory gemm sweep" bash tools/h200/bench_runs.sh
set -uo pipefail
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2  # the mxcheck script
for b in ${BENCHES:-training quantize memory gemm sweep}; do
    case $b in
        training) cmd="python3 benchmarks/bench_training_step.py --device cuda --recipes mxfp4 mxfp8 fp8 nvfp4 --profile ${PROFILE_TOP:-0}" ;;
        training-triton) cmd="python3 benchmarks/bench_training_step.py --device cuda --recipes mxfp4 --backend triton" ;;
        training-compiled) cmd="python3 benchmarks/bench_training_step.py --device cuda --recipes mxfp4 fp8 --compile-quantizers" ;;
        quantize) cmd="python3 benchmarks/bench_quantize.py --device cuda --compile --repeat 30" ;;
        memory) cmd="python3 benchmarks/bench_memory.py --device cuda" ;;
        gemm) cmd="python3 benchmarks/bench_gemm.py --device cuda --profile ${PROFILE_TOP:-0}" ;;
        sweep) cmd="mxcheck sweep --model flux-12b --out $OUT/sweep_12b -q" ;;
    esac
    [ "$b" = sweep ] || cmd="$cmd --json $OUT/bench_$b.json"
    start=$(date +%s%N)
    timeout "${BENCH_TIMEOUT:-240}" $cmd > "$OUT/bench_$b.log" 2>&1
    rc=$?; ms=$(( ($(date +%s%N) - start) / 1000000 ))
    echo "== $b: exit $rc, $ms ms"; grep -v -E "^(USDT|\s*$)" "$OUT/bench_$b.log" | tail -${TAIL:-12}
done

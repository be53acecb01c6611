#!/usr/bin/env bash
# On the H200: the fused MX kernels' cuda tests, then issue 15's benchmarks that they move.
# Logs and JSON under $OUT. STEPS picks a subset (tests train graph configs quantize gemm memory host triton syncs sweep).
set -uo pipefail
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/gfloat ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        $(ls .whl/*.whl | grep -v transformer_engine) 2>&1 | tail -2
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
run() {  # name, timeout, command...
    local name=$1 limit=$2; shift 2
    local start=$(date +%s)
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name: exit $?, $(( $(date +%s) - start )) s"
}
for step in ${STEPS:-tests train configs quantize}; do
    case $step in
        tests) run cuda_tests 300 python3 -m pytest -m cuda tests/test_mx_fused.py tests/test_device_parity.py tests/test_fp8_fused.py tests/test_gemm_inexact.py \
                   tests/test_gemm.py tests/test_nvfp4_fused.py tests/test_linear_transposes.py tests/test_cuda_syncs.py tests/test_gemm_epilogue.py tests/test_cuda_graph_step.py -q -p no:cacheprovider -n 8
               tail -4 "$OUT/cuda_tests.log" ;;
        train) for f in ${FUSED:-1}; do
                   MXCHECK_FUSED_MX=$f run train_fused$f 200 python3 benchmarks/bench_training_step.py --device cuda \
                       --recipes ${RECIPES:-mxfp4 mxfp8 fp8 nvfp4} --rounds ${ROUNDS:-3} --profile "${PROFILE_TOP:-0}" --json "$OUT/train_fused$f.json"
                   grep -E "^(bf16|mx|fp8|nvfp4)" "$OUT/train_fused$f.log"
               done ;;
        graph) run train_graph 300 python3 benchmarks/bench_training_step.py --device cuda --cuda-graph \
                   --recipes ${RECIPES:-mxfp4 mxfp8 fp8 nvfp4} --rounds ${ROUNDS:-3} --json "$OUT/train_graph.json"
               grep -E "^(bf16|mx|fp8|nvfp4)|Error" "$OUT/train_graph.log" ;;
        configs) run fused_configs 200 python3 benchmarks/bench_fused_configs.py; cat "$OUT/fused_configs.log" | grep -v "^/" | head -80 ;;
        quantize) run quantize 150 python3 benchmarks/bench_quantize.py --device cuda --compile --repeat 30 --json "$OUT/quantize.json"
                  grep "case=" "$OUT/quantize.log" ;;
        gemm) run gemm 150 python3 benchmarks/bench_gemm.py --device cuda --json "$OUT/gemm.json"; tail -12 "$OUT/gemm.log" ;;
        host) run host_profile 200 python3 benchmarks/profile_host.py --device cuda --recipes ${RECIPES:-mxfp4 mxfp8 fp8 nvfp4} --top 45
              grep -E "^== |function calls" "$OUT/host_profile.log" ;;
        triton) run train_triton 200 python3 benchmarks/bench_training_step.py --device cuda --recipes mxfp4 --backend triton \
                    --json "$OUT/train_triton.json"
                grep -E "^(bf16|mx)" "$OUT/train_triton.log" ;;
        syncs) run syncs 200 python3 benchmarks/find_syncs.py --recipes ${RECIPES:-mxfp4 mxfp8 fp8 nvfp4}
               grep -A12 "^== " "$OUT/syncs.log" | cut -c1-220 ;;
        sweep) # A fresh machine compiles the kernels in the first pass. The image ships no
               # bytecode and sets PYTHONDONTWRITEBYTECODE, so every process compiles torch's,
               # numpy's and sympy's sources again (42% of the sweep's samples under py-spy,
               # benchmarks/README.md); PYC=1 lets the first pass write bytecode, as a usual
               # install has it.
               for pass in cold warm; do
                   ( [ "${PYC:-0}" = 1 ] && unset PYTHONDONTWRITEBYTECODE
                     run sweep_$pass 200 /usr/bin/time -f "%e s wall" mxcheck sweep --model flux-12b --out "$OUT/sweep_12b_$pass" -q )
                   tail -1 "$OUT/sweep_$pass.log"
               done
               python3 tools/h200/same_records.py references/baselines/h200/bench/sweep_12b_final.json \
                   "$OUT/sweep_12b_warm/sweep.json" ;;
        memory) run memory 120 python3 benchmarks/bench_memory.py --device cuda --json "$OUT/memory.json"; tail -12 "$OUT/memory.log" ;;
    esac
done

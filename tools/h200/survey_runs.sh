#!/usr/bin/env bash
# On the lent GPU (after install_carried.sh / gpu_runner_suite.sh put torchao, TransformerEngine
# and amd-aiter where python3 imports them): the survey's GPU rows, one record per library
# under $OUT/conventions, each merged with the runs the checkout's record has (the CPU ones).
# Copy them back into references/conventions/ and regenerate the page:
#   cp OUT/conventions/*.json references/conventions/ && python tools/survey_conventions.py --page-only
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/conventions" && cp references/conventions/*.json "$OUT/conventions/"
for lib in torchao transformer_engine aiter_triton; do
    timeout 540 python3 tools/survey_conventions.py --library "$lib" --device cuda --out "$OUT/conventions" \
        2>&1 | grep -v -i warn | tail -4
done

#!/usr/bin/env bash
# On the GPU machine: the survey's GPU libraries, each record merged with the runs the checkout's
# record has (the CPU ones) under $OUT/conv; copy them back and regenerate the page:
#   cp OUT/conv/*.json references/conventions/ && python tools/survey_conventions.py --page-only
# then `mxcheck fit` of each GPU backend on its device (FITS). TransformerEngine needs
# install_carried.sh first; torchao's releases and AITER's files travel in .te/ (tools/README.md).
#   LIBS="torchao aiter_triton" FITS="torchao:mxfp8 aiter_triton:mxfp4-1x32" bash tools/h200/survey_runs.sh
set -uo pipefail
# AITER's files without its HIP __init__ (tools/h200/aiter_loader.py); its dist-info goes where
# importlib.metadata finds the release, its package stays off sys.path.
if [ -f .te/aiter.tgz ] && [ ! -d /tmp/aiter/aiter ]; then
    mkdir -p /tmp/aiter /tmp/site && tar xzf .te/aiter.tgz -C /tmp/aiter && mv /tmp/aiter/amd_aiter-*.dist-info /tmp/site/
fi
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 MXCHECK_AITER_PATH=/tmp/aiter OMP_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2  # the pytest11 entry point
# torchao releases side by side (the survey's --installs), from the carried wheels in .te/tao
mkdir -p /tmp/inst
for w in .te/tao/torchao-*.whl; do
    v=$(basename "$w" | cut -d- -f2)
    python3 -m pip install -q --no-index --no-deps --no-compile --target "/tmp/inst/torchao-$v" "$w"
done
mkdir -p "$OUT/conv" && cp references/conventions/*.json "$OUT/conv/"
for lib in ${LIBS:-}; do
    extra=""; [ "$lib" = torchao ] && extra="--installs /tmp/inst"
    start=$(date +%s)
    timeout "${SURVEY_TIMEOUT:-420}" python3 tools/survey_conventions.py --library "$lib" --device cuda $extra \
        --out "$OUT/conv" > "$OUT/survey_$lib.log" 2>&1
    echo "== survey $lib: exit $? in $(( $(date +%s) - start )) s"; tail -4 "$OUT/survey_$lib.log"
done
# FITS: "backend:recipe ..." (torchao from the newest release installed above)
tao=$(ls -d /tmp/inst/torchao-* 2>/dev/null | sort -V | tail -1)
for spec in ${FITS:-}; do
    b=${spec%%:*}; r=${spec#*:}
    PYTHONPATH=$PYTHONPATH:$tao timeout 240 python3 -m mxcheck fit --backend "$b" --recipe "$r" > "$OUT/fit_${b}_$r.log" 2>&1
    echo "== fit $b $r: exit $?"; head -40 "$OUT/fit_${b}_$r.log"
done

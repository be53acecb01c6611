#!/usr/bin/env bash
# On the H200 (16 cores), without TE: the carried test wheels, the project, then the flake hunt
# (tools/seed_sweep.sh: every seeded emulated test under SEEDS random seeds). Logs under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
if [ ! -d /tmp/site/gfloat ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        $(ls .whl/*.whl | grep -v transformer_engine) 2>&1 | tail -2
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
SEEDS=${SEEDS:-6} PYTEST="python3 -m pytest" XDIST="-n ${WORKERS:-15}" timeout "${SEED_TIMEOUT:-540}" \
    bash tools/seed_sweep.sh 2>&1 | tee "$OUT/seed_sweep.log"

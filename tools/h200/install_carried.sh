#!/usr/bin/env bash
# On the H200: finish the TE core wheel from its carried pieces, check it, and install every
# carried wheel into /tmp/site (no network there). Usage: bash tools/h200/install_carried.sh SHA256
set -euo pipefail
want=${1:?sha256 of the TE core wheel}
core=/tmp/te/transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl
if [ -f /tmp/te/core.whl ]; then mv /tmp/te/core.whl "$core"; fi
echo "$want  $core" | sha256sum -c -
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl "$core"
if [ -f .te/aiter.tgz ]; then mkdir -p /tmp/aiter && tar xzf .te/aiter.tgz -C /tmp/aiter; fi
echo "installed into /tmp/site: $(ls /tmp/site | tr '\n' ' ')"

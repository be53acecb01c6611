"""The sharded run against the single-process run: too slow for the CPU suite (about a minute).

Not ``emulated``: CI deselects it; ``pytest -m slow tests/test_distributed_slow.py`` runs it.
"""

from __future__ import annotations

import pytest

from mxcheck.report import Report
from mxcheck.training import TrainConfig, check_tracks, make_model, train
from tests.convergence.test_convergence import BANDS
from tests.test_distributed import _torchrun

pytestmark = [pytest.mark.slow, pytest.mark.convergence]


def test_sharded_bf16_is_the_single_process_run_and_mxfp4_tracks_it(tmp_path):
    """Two ranks of two rows each train what one process trains on the four rows (the same
    draws of t and noise, gradients averaged in FP32): the curves agree to 0.08% (measured;
    the band is 0.5%). Then mxfp4 on the sharded model tracks the sharded bf16 run."""
    out = tmp_path / "mxfp4.json"
    done, _ = _torchrun(out, "--recipe", "mxfp4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = {(r.recipe, r.kind): r for r in Report.load(out).records if r.test_id.endswith("::converge")}
    sharded = found["bf16", "loss_falls"].extra["losses"]
    cfg = TrainConfig(samples=4)
    single = train(make_model(cfg), cfg).losses
    check_tracks(sharded, single, 0.005, what="sharded bf16 against one process")
    check_tracks(found["mxfp4", "loss_falls"].extra["losses"], sharded, BANDS["mxfp4"], what="sharded mxfp4")
    assert all(r.passed for r in found.values())

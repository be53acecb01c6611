"""The aiter_triton backend: AITER's Triton MXFP4 files loaded without aiter's __init__.

CPU parts: availability reasons, recipe support, the loader's sys.modules isolation and the
AMD-only launch options against the wheel's own kernel signature and tuned configs. The
kernels themselves run under ``-m cuda`` (H200) and through the conformance suite
(``--mxcheck-backend aiter_triton``)."""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
import types

import pytest
import torch

from mxcheck.backends import Refusal, aiter_triton
from mxcheck.backends.aiter_triton import AiterTritonBackend
from mxcheck.profiles import get_profile
from mxcheck.recipes import RECIPES
from tests.fakes import aiter_wheel


def _wheel_tree():
    try:
        return aiter_triton.aiter_tree()
    except ValueError as e:
        pytest.skip(str(e)) if aiter_wheel.load() is None else pytest.fail(str(e))


@pytest.mark.emulated
def test_unavailable_on_a_cpu_names_the_devices_it_needs(monkeypatch):
    monkeypatch.setenv("MXCHECK_FAKE_HARDWARE", "cpu")
    ok, why = AiterTritonBackend().available()
    assert not ok and "gfx950 or an NVIDIA sm90+" in why


@pytest.mark.emulated
def test_supports_exactly_the_1x32_even_e2m1_recipes():
    backend = AiterTritonBackend()
    verdicts = {name: backend.supports(name) for name in RECIPES}
    assert {n for n, (ok, _) in verdicts.items() if ok} == {"mxfp4", "mxfp4-1x32"}
    assert backend.supports("mxfp4-1x32+sr")[0]  # SR operands: quantize refuses them, gemm takes them
    ok, why = verdicts["mxfp4-fp8bwd"]
    assert not ok and "g_row is e5m2" in why


@pytest.mark.emulated
def test_quantize_refuses_what_the_kernel_does_not_document():
    backend = AiterTritonBackend()
    spec = RECIPES["mxfp4-1x32"].spec("x_row")
    with pytest.raises(ValueError, match="1x32 MX blocks; spec has scaling='nvfp4'"):
        backend.quantize(torch.ones(4, 32), RECIPES["nvfp4"].spec("x_row"))
    for field, value in (("scale_rule", "floor"), ("rounding", "sr"), ("hadamard", "h32")):
        with pytest.raises(ValueError, match=f"produces {field}="):
            backend.quantize(torch.ones(4, 32), dataclasses.replace(spec, **{field: value}))
    with pytest.raises(Refusal, match=r"x\.dtype=torch\.float64"):
        backend.quantize(torch.ones(4, 32, dtype=torch.float64), RECIPES["mxfp4-1x32"].spec("x_row"))
    with pytest.raises(ValueError, match="K a multiple of 32"):
        backend.quantize(torch.ones(4, 48), RECIPES["mxfp4-1x32"].spec("x_row"))


@pytest.mark.emulated
def test_a_tree_without_the_kernel_files_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("MXCHECK_AITER_PATH", str(tmp_path))
    with pytest.raises(ValueError, match=f"no aiter/utility/fp4_utils.py under {tmp_path}"):
        aiter_triton.aiter_tree()


@pytest.mark.emulated
def test_the_bare_packages_leave_sys_modules_as_they_were(monkeypatch, tmp_path):
    # A module of the tree imports the chip_info stub and a sibling, as the wheel's files do;
    # an `aiter` already imported (the HIP adapter's) is back afterwards, the stubs are gone.
    (tmp_path / "aiter" / "utility").mkdir(parents=True)
    (tmp_path / "aiter" / "utility" / "sibling.py").write_text("VALUE = 7\n")
    (tmp_path / "aiter" / "utility" / "probe.py").write_text(
        "from aiter.jit.utils.chip_info import get_gfx\nfrom aiter.utility.sibling import VALUE\n"
        "GFX = get_gfx()\n")
    theirs = types.ModuleType("aiter")
    monkeypatch.setitem(sys.modules, "aiter", theirs)
    # another test in this worker may have imported the wheel's own aiter.* modules (the
    # AITER adapter's witnesses): those stay, and nothing is added or taken
    before = {n: m for n, m in sys.modules.items() if n.startswith("aiter.")}
    with aiter_triton._bare_aiter(tmp_path):
        probe = __import__("aiter.utility.probe", fromlist=["GFX"])
        assert sys.modules["aiter"] is not theirs
    assert (probe.GFX, probe.VALUE) == ("gfx950", 7)
    assert sys.modules["aiter"] is theirs
    assert {n: m for n, m in sys.modules.items() if n.startswith("aiter.")} == before


def _kernel_parameters(tree) -> set[str]:
    source = (tree / "aiter" / "ops" / "triton" / "_triton_kernels" / "gemm_afp4wfp4.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.FunctionDef) and n.name == "_gemm_afp4_wfp4_kernel")
    return {a.arg for a in fn.args.args}


@pytest.mark.emulated
def test_nvidia_config_keeps_every_kernel_parameter_and_only_nvidia_launch_options():
    # Every key of every tuned MI350X config (AITER's own files) is a kernel parameter, an
    # option NVIDIA's Triton takes, or one this backend drops as AMD-only: a new AMD-only
    # key in a later release fails here instead of at launch on the H200.
    tree = _wheel_tree()
    params = _kernel_parameters(tree)
    nvidia_options = {"num_warps", "num_stages", "num_ctas", "maxnreg"}
    files = sorted((tree / "aiter" / "ops" / "triton" / "configs" / "gemm").glob("MI350X-GEMM-AFP4WFP4*.json"))
    assert files
    dropped = set()
    for f in files:
        for config in json.loads(f.read_text()).values():
            kept = aiter_triton.nvidia_config(config)
            assert set(kept) <= params | nvidia_options, (f.name, set(kept) - params - nvidia_options)
            dropped |= set(config) - set(kept)
    assert dropped and dropped <= set(aiter_triton.AMD_ONLY_OPTIONS)


@pytest.mark.cuda
def test_backend_quantize_is_the_kernel_the_profile_pins():
    backend = AiterTritonBackend()
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 1024, generator=g) * torch.logspace(-3, 3, 64).unsqueeze(1)).bfloat16()
    q = backend.quantize(x.cuda(), RECIPES["mxfp4-1x32"].spec("x_row"))
    codes, want = get_profile("aiter.mxfp4.triton").quantize(x)
    assert torch.equal(q.codes.cpu(), codes)
    negative = want < 127  # the kernel's saturated byte (test_aiter_triton_vectors.py)
    assert torch.equal(q.scales.cpu()[~negative], want[~negative])
    assert bool((q.scales.cpu()[negative] == 127).all()) and bool(negative.any())


@pytest.mark.emulated
def test_the_report_names_the_aiter_tree_version_when_no_distribution_is_installed(monkeypatch, tmp_path):
    from mxcheck.report import environment

    (tmp_path / "aiter").mkdir()
    (tmp_path / "aiter" / "_version.py").write_text("__version__ = '9.8.7.dev1'\n")
    monkeypatch.setenv("MXCHECK_AITER_PATH", str(tmp_path))
    monkeypatch.setattr(environment, "_distribution_version", lambda *a: None)
    assert environment.package_versions(["aiter"]) == {"aiter": f"9.8.7.dev1 (MXCHECK_AITER_PATH={tmp_path})"}


@pytest.mark.cuda
@pytest.mark.parametrize(("m", "n", "k"), [(256, 256, 512), (32, 64, 384), (4096, 3072, 3072)])
def test_backend_gemm_is_within_the_fp32_accumulation_bound(m, n, k):
    # (256, 256, 512) picks AITER's "large" MI350X config, 230 KiB of shared memory at its 3
    # stages: more than an H200 has (the adapter lowers the stages); 384 is not whole K tiles.
    from mxcheck.conformance._common import _assert_in_bound
    from mxcheck.scaling.mx import mx_quantize

    backend = AiterTritonBackend()
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    g = torch.Generator().manual_seed(m + n + k)
    a, b = (mx_quantize(torch.randn(r, k, generator=g).bfloat16().cuda(), "e2m1", scale_rule="even") for r in (m, n))
    _assert_in_bound(backend.gemm(a, b), a, b, f"aiter_triton gemm M={m} N={n} K={k}")

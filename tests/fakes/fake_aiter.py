"""A fake ``aiter`` package as strict as the released one, for CPU tests of the AITER adapter.

What it models (ROCm/aiter; tags resolved in a clone of the public repository):

* ``aiter.gemm_a4w4``: ``aiter/ops/gemm_op_a4w4.py`` @ v0.1.20.post1 (de07f3885ee5) in its
  current form ``(A, B, A_scale, B_scale, bias=None, dtype=bf16, alpha, beta, bpreshuffle)``
  (from v0.1.9, 2d714384fa28) and @ v0.1.8 (9402062ebd61) in its legacy form ``(A, B,
  A_scale, B_scale, out, bias, alpha, beta, bpreshuffle)`` (v0.1.7, de14bec0ca5a, and v0.1.8).
  From v0.1.7 both are wrapped by ``aiter/jit/utils/torch_guard.py::torch_compile_guard``
  into ``wrapper_custom(*args, **kwargs)`` without ``functools.wraps``, and the call goes
  through a torch op schema that rejects a missing or unknown argument. No tuned CSV is
  modelled, so every shape takes the ASM path: ``csrc/py_itfs_cu/asm_gemm_a4w4.cu`` @
  v0.1.20.post1 checks ``out->dtype() == bf16`` ("only support BFloat16 output now!"), and
  ``gemm_a4w4`` asserts the output rows are padded to 32 (current form: it pads them).
* The f4gemm kernel reads whole 256-wide K tiles (ROCm/aiter #2900, commit 1d5a73b10b: "the
  GEMM kernel reads the scale buffer using the physical column width ceil(K/32/8)*8";
  issue #4176). The fake reads, per row, ``ceil(K/256)*128`` bytes from the row's start in
  the operand's storage (so the bytes past a row's end are the next row's, or garbage past
  the buffer) and the scale columns up to ``ceil(K/32, 8)``.
* ``aiter.utility.fp4_utils.e8m0_shuffle``: ``aiter/ops/shuffle.py::shuffle_scale`` @
  v0.1.20.post1 (0.1.7 wheel: inline in ``fp4_utils.py``) pads with ``torch.empty``; the fake
  fills that padding with fixed *finite* garbage (scale bytes 120..135), the silent case.
* E8M0 byte 0xFF decodes to NaN, byte 0 to 2^-127 (``fp4_utils.py::e8m0_to_f32``).
* MXFP6 (``gemm_a6w6``, ``quant_mxfp6_gemm``) exists only on branch ``mxfp6-gemms-clean``
  (878d1dea2b84) and in no release up to v0.1.20.post1: absent unless ``mxfp6=True``. There,
  ``quant_mxfp6_gemm`` (``aiter/ops/gemm_op_a6w6.py``) takes the HIP packer for bf16/fp16
  input on gfx950 (round to nearest even) and the Triton/torch packer for float32
  (ties away); ``gemm_a6w6`` writes bf16 only.
* The installed version is what ``importlib.metadata.version("amd-aiter")`` says: the fake
  installs a distribution finder for it.

Numerics are computed from the raw bytes (AITER's E2M1 table, low nibble first) in float64.
"""

from __future__ import annotations

import importlib.metadata as md
import inspect
import pathlib
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from mxcheck import layouts
from mxcheck.scaling.mx import mx_quantize

RELEASED = "0.1.20.post1"
LEGACY = "0.1.8"  # the last release whose gemm_a4w4 takes `out`
K_TILE = 256
GARBAGE_SCALES = 120  # padding bytes 120..135: finite scales 2^-7..2^8, the silent case

E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
_c = torch.arange(64)
_mag = torch.where((_c >> 3) & 3 == 0, (_c & 7) / 8, 2.0 ** (((_c >> 3) & 3) - 1) * (1 + (_c & 7) / 8))
E2M3 = torch.where((_c >> 5) & 1 == 1, -_mag, _mag).double()


def e8m0(scales: torch.Tensor) -> torch.Tensor:
    """AITER e8m0_to_f32 in float64: 2^(b-127), byte 0xFF NaN."""
    b = scales.view(torch.uint8).double()
    return torch.where(b == 255, torch.nan, 2.0 ** (b - 127))


def _garbage(n: int, base: int = GARBAGE_SCALES) -> torch.Tensor:
    return (base + torch.arange(n) % 16).to(torch.uint8)


def e8m0_shuffle(scale: torch.Tensor) -> torch.Tensor:
    """shuffle_scale, padding as torch.empty leaves it (here: fixed finite garbage)."""
    assert scale.ndim == 2, "scale must be a 2D tensor"
    m, n = scale.shape
    sm, sn = -(-m // 256) * 256, -(-n // 8) * 8
    padded = _garbage(sm * sn).view(sm, sn)
    padded[:m, :n] = scale.view(torch.uint8)
    out = padded.view(sm // 32, 2, 16, sn // 8, 2, 4).permute(0, 3, 5, 2, 4, 1).contiguous()
    return out.view(sm, sn).view(scale.dtype)


def shuffle_weight(x: torch.Tensor, layout: tuple[int, int] = (16, 16), use_int4: bool = False) -> torch.Tensor:
    """aiter/ops/shuffle.py::shuffle_weight (its asserts included)."""
    dtype, xb = x.dtype, x.view(torch.uint8)
    bn, bk = layout[0], layout[1] * 2
    assert xb.shape[-2] % bn == 0, f"{xb.shape[-2]} % {bn} == {xb.shape[-2] % bn}"
    assert xb.shape[-1] % bk == 0, f"{xb.shape[-1]} % {bk} == {xb.shape[-1] % bk}"
    return layouts.shuffle_weight(xb, layout).view(dtype)


def _rows_read(data: torch.Tensor, k_read_bytes: int) -> torch.Tensor:
    """What a kernel reading k_read_bytes from each row's start in storage sees."""
    rows, stride = data.shape[0], data.stride(0)
    flat = data.view(torch.uint8).flatten()
    need = (rows - 1) * stride + k_read_bytes
    if need > flat.numel():  # past the buffer: whatever memory follows
        flat = torch.cat([flat, _garbage(need - flat.numel(), base=0x33)])
    idx = torch.arange(rows)[:, None] * stride + torch.arange(k_read_bytes)[None, :]
    return flat[idx]


def _dec_fp4(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    b = data.long()
    vals = E2M1[torch.stack([b & 0xF, b >> 4], -1).flatten(-2)]
    return vals * e8m0(scales).repeat_interleave(32, -1)


def _asm_a4w4(A, B, A_scale, B_scale, out, bias, bpreshuffle) -> None:
    if out.dtype != torch.bfloat16:
        raise RuntimeError("gemm_a4w4_asm only support BFloat16 output now!")
    m, n, k = A.shape[0], B.shape[0], 2 * A.shape[1]
    if 2 * B.shape[1] != k:
        raise RuntimeError(f"gemm_a4w4_asm: A has K={k}, B has K={2 * B.shape[1]}")
    kp = -(-k // K_TILE) * K_TILE
    want = (-(-m // 256) * 256, kp // 32), (-(-n // 256) * 256, kp // 32)
    if (tuple(A_scale.shape), tuple(B_scale.shape)) != want:
        raise RuntimeError(f"fake gemm_a4w4: scales {tuple(A_scale.shape)}, {tuple(B_scale.shape)}; the kernel "
                           f"strides them as {want} (e8m0_shuffle of [M, K/32], [N, K/32])")
    b = layouts.unshuffle_weight(B.view(torch.uint8)) if bpreshuffle else B.view(torch.uint8)
    sa = layouts.unshuffle_scale(A_scale.view(torch.uint8), m, kp // 32)
    sb = layouts.unshuffle_scale(B_scale.view(torch.uint8), n, kp // 32)
    res = _dec_fp4(_rows_read(A, kp // 2), sa) @ _dec_fp4(_rows_read(b, kp // 2), sb).T
    if bias is not None:
        res = res + bias.double().reshape(-1, n)
    out[:m] = res.to(out.dtype)


def _gemm_a4w4_current(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
                       bias: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16,
                       alpha: float = 1.0, beta: float = 0.0, bpreshuffle: bool = True) -> torch.Tensor:
    m = A.shape[0]
    out = torch.empty((-(-m // 32) * 32, B.shape[0]), dtype=dtype)
    _asm_a4w4(A, B, A_scale, B_scale, out, bias, bpreshuffle)
    return out[:m]


def _gemm_a4w4_legacy(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
                      out: torch.Tensor, bias: torch.Tensor | None = None, alpha: float = 1.0, beta: float = 0.0,
                      bpreshuffle: bool = True) -> torch.Tensor:
    assert out.shape[0] % 32 == 0, "Dim0 of gemm_a4w4_asm output needs to be padded to multiples of 32!"
    _asm_a4w4(A, B, A_scale, B_scale, out, bias, bpreshuffle)
    return out


def compile_guarded(impl: Any, name: str) -> Any:
    """torch_compile_guard's wrapper: (*args, **kwargs), no functools.wraps, schema-checked."""
    sig = inspect.signature(impl)

    def wrapper_custom(*args: Any, **kwargs: Any) -> Any:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:  # what the torch op schema says, in its words
            raise RuntimeError(f"aiter::{name}() {e}") from None
        return impl(*args, **kwargs)

    return wrapper_custom


def dynamic_mxfp4_quant(x: torch.Tensor, scaling_mode: str = "even", shuffle: bool = False):
    """fp4_utils.dynamic_mxfp4_quant, shuffle=False: ([M, K/2] fp4x2, [M, ceil(K/32)] e8m0)."""
    if shuffle:
        raise NotImplementedError("fake models shuffle=False only")
    q = mx_quantize(x, "e2m1", scale_rule=scaling_mode)
    codes = q.codes
    return (codes[..., ::2] | (codes[..., 1::2] << 4)).view(torch.float4_e2m1fn_x2), q.scales.view(torch.float8_e8m0fnu)


def quant_mxfp6_gemm(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Branch mxfp6-gemms-clean: HIP packer (RNE) for bf16/fp16, Triton/torch (ties away) for fp32."""
    rounding = "rne" if w.dtype in (torch.bfloat16, torch.float16) else "half_away"
    q = mx_quantize(w.float(), "e2m3", rounding=rounding, hadamard="h32", zero_scale=127)
    return layouts.pack_mxfp6_blob(q.codes, q.scales)


def _gemm_a6w6(A, B, A_scale, B_scale, M, N, K, dtype=torch.bfloat16, alpha=1.0, kernelName=None, bias=None):
    if dtype != torch.bfloat16:
        raise RuntimeError("gemm_a6w6 only supports bfloat16 output")
    (ac, asc), (bc, bsc) = layouts.unpack_mxfp6_blob(A, A_scale, M, K), layouts.unpack_mxfp6_blob(B, B_scale, N, K)
    dec = [E2M3[c.long()] * e8m0(s).repeat_interleave(32, -1) for c, s in ((ac, asc), (bc, bsc))]
    return (dec[0] @ dec[1].T).to(dtype)


class _Dist(md.Distribution):
    def __init__(self, version: str, name: str = "amd-aiter") -> None:
        self._meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"

    def read_text(self, filename: str) -> str | None:
        return self._meta if filename == "METADATA" else None

    def locate_file(self, path: Any) -> pathlib.Path:
        return pathlib.Path(str(path))


class _DistFinder:
    """A meta-path finder that finds no module, only one distribution (amd-aiter unless named)."""

    def __init__(self, version: str, name: str = "amd-aiter") -> None:
        self.version, self.name = version, name

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None

    def find_distributions(self, context: Any = None) -> Any:
        name = getattr(context, "name", None)
        if name is None or name.replace("-", "_").lower() == self.name.replace("-", "_"):
            return iter([_Dist(self.version, self.name)])
        return iter(())


def module_tree(mp: pytest.MonkeyPatch, *names: str) -> dict[str, ModuleType]:
    """Empty modules named ``names`` (parents first), each set on its parent and put in
    sys.modules, all undone with ``mp``."""
    mods = {n: ModuleType(n) for n in names}
    for n, m in mods.items():
        parent, _, child = n.rpartition(".")
        if parent:
            setattr(mods[parent], child, m)
        mp.setitem(sys.modules, n, m)
    return mods


def install(mp: pytest.MonkeyPatch, *, version: str = RELEASED, mxfp6: bool = False) -> SimpleNamespace:
    """Put the fake in sys.modules (undone with ``mp``); returns the module objects."""
    mods = module_tree(mp, "aiter", "aiter.utility", "aiter.utility.fp4_utils", "aiter.ops", "aiter.ops.shuffle")
    mp.setattr(sys, "meta_path", [_DistFinder(version), *sys.meta_path])
    aiter = mods["aiter"]
    aiter.dtypes = SimpleNamespace(fp4x2=torch.float4_e2m1fn_x2, fp8_e8m0=torch.float8_e8m0fnu, bf16=torch.bfloat16)
    legacy = tuple(int(p) for p in version.split(".")[:3]) < (0, 1, 9)
    aiter.gemm_a4w4 = compile_guarded(_gemm_a4w4_legacy if legacy else _gemm_a4w4_current, "gemm_a4w4")
    if mxfp6:
        aiter.gemm_a6w6, aiter.quant_mxfp6_gemm = _gemm_a6w6, quant_mxfp6_gemm
    fp4 = mods["aiter.utility.fp4_utils"]
    fp4.dynamic_mxfp4_quant, fp4.e8m0_shuffle = dynamic_mxfp4_quant, e8m0_shuffle
    mods["aiter.ops.shuffle"].shuffle_weight = shuffle_weight
    return SimpleNamespace(**{n.rpartition(".")[2]: m for n, m in mods.items()})

"""What a backend is: the methods the conformance suite calls, what they return, and what
each exception means. ``mxcheck.backends.Backend`` is this Protocol.

Outcomes a backend can cause, and how the suite counts them:

=================  ===========================================================  ===========
outcome            how the backend says it                                      counted as
=================  ===========================================================  ===========
not supported      ``supports(recipe)`` returns ``(False, why)``                skipped
not runnable here  ``available()`` returns ``(False, why)``                     skipped (*)
refused            a method raises :class:`Refusal` (a shape, dtype, feature)   skipped
failed             any other exception, or bits / SNR outside the contract      failed
=================  ===========================================================  ===========

(*) Where ``why`` is a :class:`MissingDependency` (a package absent, too old or too new),
``--mxcheck-require-deps`` fails instead of skipping.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from mxcheck.gemm import QTensor
    from mxcheck.recipes import OperandSpec, Recipe
    from mxcheck.scaling.fp8 import DelayedScaling

__all__ = ["Backend", "FakeQuantizeBackend", "FullBackend", "GemmBackend", "LinearBackend", "MissingDependency",
           "QuantizeBackend", "Refusal", "version_problem"]


class Refusal(ValueError):
    """Raised by ``quantize``, ``gemm`` or ``linear`` for an input the backend declares it
    cannot take (a shape that does not tile, an input dtype, a feature such as 2D blocks),
    with the reason as its message. The suite records it as *refused*, never as a pass.

    Any other exception from a backend method, on a recipe ``supports()`` accepted, is a
    failure: a ``ValueError`` raised by a kernel's own argument check is a bug to report,
    not a refusal."""


class MissingDependency(str):
    """An ``available()`` reason naming a package that is absent, too old or too new.

    A ``str`` (it prints as the reason) that also carries ``package``, ``needed`` (a
    requirement such as ``">=0.14"``) and ``found`` (the installed version, or None). Under
    ``--mxcheck-require-deps`` the plugin fails the backend's tests instead of skipping them.
    """

    package: str
    needed: str
    found: str | None

    def __new__(cls, package: str, needed: str = "", found: str | None = None, detail: str = "") -> MissingDependency:
        if found is None:
            text = f"needs {package}{needed} (not installed)"
        else:
            text = f"needs {package}{needed} (found {found})"
        self = super().__new__(cls, f"{text}: {detail}" if detail else text)
        self.package, self.needed, self.found = package, needed, found
        return self


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "0.14.1+cu126" -> (0, 14, 1)."""
    m = re.match(r"\d+(?:\.\d+)*", version)
    if m is None:
        raise ValueError(f"version={version!r}: expected a release such as '0.14' or '0.18.0'")
    return tuple(int(p) for p in m.group().split("."))


def version_problem(package: str, minimum: str | None = None, *, below: str | None = None) -> MissingDependency | None:
    """None when ``package`` (a distribution name) is installed at ``minimum <= v < below``,
    else a :class:`MissingDependency` saying which version is needed and which was found."""
    needed = ",".join(p for p in (minimum and f">={minimum}", below and f"<{below}") if p)
    try:
        found = metadata.version(package)
    except metadata.PackageNotFoundError:
        return MissingDependency(package, needed, None)
    v = _release(found)
    if (minimum and v < _release(minimum)) or (below and v >= _release(below)):
        return MissingDependency(package, needed, found)
    return None


@runtime_checkable
class Backend(Protocol):
    """The thing under test. Only ``name``, ``available`` and ``supports`` are required; a
    backend offers any of ``quantize`` (codes), ``fake_quantize`` (values), ``gemm`` and
    ``linear``, and the checks that need a method it lacks are skipped with that reason.
    Optional attributes:

    ``claims``
        What the backend claims to compute bit for bit: recipe names (``"ocp-mxfp8-e4m3"``),
        ``"RECIPE@PROFILE"`` (a recipe pinned to a profile's quirks), paths of recipe files
        or ``Recipe`` objects. Conformance runs every check on every claim
        (``--mxcheck-recipe`` overrides). Without it, every built-in recipe that
        ``supports`` accepts is run.
    ``device``
        Where the suite puts inputs (``"cpu"`` when absent).
    ``input_dtypes``
        Input dtypes ``quantize`` accepts (default float32, bfloat16, float16); each is fed.
    ``gemm_out_dtypes``
        Output dtypes ``gemm`` writes (default float32 only).
    ``gemm_mxfp6_blob``
        ``gemm_mxfp6_blob(a_blob, b_blob, a_scales, b_scales, m, n, k)``: a GEMM that reads
        AITER's padded MXFP6 byte blobs directly (check_poison_guard_tiles feeds it blobs
        whose guard tiles are 0xFF); without it the blobs are unpacked for ``gemm``.
    ``sr_bits``
        ``"oracle"`` if stochastic rounding takes its random bits from ``torch``'s default
        generator as the reference Function does (then SR GEMMs are held to the reference
        Function's outputs, 40 dB, as unrounded ones are); ``"own"`` (the default): SR GEMMs
        are held to SR statistics (inside the all-down / all-up envelope, no bias beyond a
        Bernstein bound) and to float64 truth (``mxcheck.conformance.sr_linear``).
    """

    name: str

    def available(self) -> tuple[bool, str]:
        """(usable here?, why not). A :class:`MissingDependency` reason names a package."""
        ...

    def supports(self, recipe: Recipe) -> tuple[bool, str]:
        """(does the backend compute this ``mxcheck.recipes.Recipe``?, why not)."""
        ...


class QuantizeBackend(Backend, Protocol):
    """A backend with a quantizer: judged bit for bit against the oracle (check_quantize,
    poison_padding)."""

    def quantize(self, x: torch.Tensor, spec: OperandSpec, *, state: DelayedScaling | None = None) -> QTensor:
        """Quantize the 2D NT operand ``x`` [rows, K] along its last axis (the contraction
        axis) as ``spec`` says, and return the oracle's type for ``spec.scaling``:

        - ``"mx"``: ``mxcheck.MXTensor``; ``codes`` uint8, one code per element, shaped like x
          (K padded when ``spec.pad_to``), the sign in the top bit of the element width;
          ``scales`` uint8 biased E8M0, [rows, K / block_size] (2D blocks: one byte per tile,
          repeated along the tile's rows as the oracle stores it).
        - ``"nvfp4"``: ``mxcheck.NVFP4Tensor``; ``codes`` e2m1 uint8 shaped like x,
          ``block_scales`` ue4m3 uint8 codes [rows, K / 16], ``tensor_scale`` float32.
          A block whose scale byte is 0 (its amax underflows ue4m3) has code 0x7 / 0xF
          (+-6: TransformerEngine multiplies by ``enc = FLT_MAX`` and saturates) for every
          non-zero element and 0x0 / 0x8 for a zero; its values are +-0. NaN anywhere in x
          makes ``tensor_scale`` NaN, every scale byte 0x7F and every code 0.
        - FP8 (``"tensor"``, ``"row"``, ``"block1x128"``, ``"block128x128"``, ``"delayed"``):
          ``mxcheck.FP8Tensor``; ``codes`` uint8 fp8 codes shaped like x, ``scale_inv``
          float32 dequantization multipliers: shape (), (rows, 1) or one per block.

        Every field a GEMM reads is compared bit for bit, scales first (``tensor_scale``,
        ``scale_inv``, ``scales``, ``block_scales``, then ``codes``); ``amax`` and FP8's
        ``scale`` are not (adapters may fill them with torch). ``pack()`` is the oracle's: fp4 two codes a byte,
        the low nibble the even index; fp6 four codes in three bytes. ``state`` is the
        operand's amax history for ``"delayed"`` specs (a ``DelayedScaling``), else None.
        A spec or shape it cannot take: raise :class:`Refusal`.
        """
        ...


class FakeQuantizeBackend(Backend, Protocol):
    """A backend that returns fake-quantized values instead of (or beside) codes, as QAT
    toolkits and training-time fake-quant kernels do: judged on values
    (``mxcheck.conformance.values``). Without ``gemm`` or ``linear`` its linears run through
    the reference Function with ``fake_quantize`` as every operand copy's quantizer."""

    def fake_quantize(self, x: torch.Tensor, spec: OperandSpec, *,
                      state: DelayedScaling | None = None) -> torch.Tensor:
        """The values of the 2D NT operand ``x`` [rows, K] quantized along its last axis as
        ``spec`` says and dequantized: shaped like ``x``, in ``x``'s dtype or float32.

        Compared with the oracle's ``dequantize()`` (in the rotated basis where
        ``spec.hadamard`` rotates), cast to the dtype returned with round-to-nearest-even:
        bit for bit for MX and FP8; an NVFP4 value may lie anywhere within the spread of the
        released float32 dequantization orders (``conformance.values.values_agree``); any NaN
        equals any NaN (a NaN's sign and payload are not compared). NVFP4: a NaN anywhere in ``x`` makes every value NaN (the tensor amax is
        NaN, as TransformerEngine's reference); a block whose ue4m3 scale byte is 0 holds
        +-0, each with its input's sign. MX: every value of a block whose E8M0 byte is 255
        is NaN. ``state`` as for ``quantize``. A spec or shape it cannot take:
        raise :class:`Refusal`.
        """
        ...


class GemmBackend(Backend, Protocol):
    """A backend with a GEMM: held to the fp32-accumulation bound of the exact product."""

    def gemm(self, a: QTensor, b: QTensor, *, out_dtype: torch.dtype,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        """``a[M, K] @ b[N, K]^T`` (NT) of two quantized operands as ``quantize`` returns
        them, in ``out_dtype`` (one of the backend's ``gemm_out_dtypes``), shape [M, N]."""
        ...


class LinearBackend(Backend, Protocol):
    """A backend with a whole quantized linear: fwd, dgrad, wgrad and bias gradient judged
    against float64 truth and the reference Function."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, recipe: Recipe, *,
               states: dict[str, DelayedScaling] | None = None) -> torch.Tensor:
        """``x[..., K] @ weight[N, K]^T + bias`` in ``recipe.out_dtype``, autograd-capable:
        gradients must reach the caller's ``x``, ``weight`` and ``bias``. ``states``: the
        operand -> ``DelayedScaling`` map of a delayed-scaling recipe, kept by the caller
        across steps; other recipes are called without it."""
        ...


class FullBackend(QuantizeBackend, FakeQuantizeBackend, GemmBackend, LinearBackend, Protocol):
    """A backend with every method (the emulated backend has all but ``fake_quantize``)."""

"""Which of torchao's casts and linears computes an OperandSpec or a Recipe, as data and
pure functions (no torchao import): ``spec_refusal`` (to_mx), ``fp8_spec_refusal`` (the
Float8 casts), ``linear_plan`` (mx_mm or Float8Linear). ``torchao_backend`` runs them."""

from __future__ import annotations

from dataclasses import dataclass

from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe

__all__ = ["TORCHAO_FORMATS", "TORCHAO_SCALE_RULES", "LinearPlan", "fp8_spec_refusal", "linear_plan",
           "spec_refusal"]

TORCHAO_FORMATS = ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2")  # to_mx element formats (torchao_compat)
TORCHAO_SCALE_RULES = ("floor", "ceil", "even", "rceil")  # torchao ScaleCalculationMode values
# The operand copies torchao quantizes from one tensor: (forward copy, backward copy).
_PAIRS = {"input": ("x_row", "x_col"), "weight": ("w_row", "w_col"), "grad_output": ("g_row", "g_col")}
# torchao Float8 scale: fp8_max / clamp(amax, 1e-12) (float8_utils.py::amax_to_scale); as a
# float32 division that is mxcheck's primus_turbo formula; rowwise floors it to 2^k (te + power_of_2).
_FP8_FORMULAS = {"tensor": ("primus_turbo", False), "row": ("te", True)}


def spec_refusal(spec: OperandSpec) -> str | None:
    """Why torchao's to_mx cannot produce what ``spec`` asks for, or None."""
    if spec.scaling != "mx":
        return f"torchao to_mx makes MX blocks; spec has scaling={spec.scaling!r}"
    if spec.fmt not in TORCHAO_FORMATS:
        return f"torchao to_mx takes {list(TORCHAO_FORMATS)}, not fmt={spec.fmt!r}"
    if spec.block_size != 32:
        return f"torchao to_mx is wired here for 32-blocks, spec has block_size={spec.block_size}"
    if spec.block_2d:
        return "torchao to_mx has no 2D (32x32) blocks; spec has block_2d=True"
    if spec.hadamard is not None:
        return f"torchao to_mx applies no Hadamard rotation; spec has hadamard={spec.hadamard!r}"
    if spec.rounding != "rne":
        return f"torchao to_mx rounds to nearest even only; spec has rounding={spec.rounding!r}"
    if spec.zero_scale != 0:
        return (f"torchao to_mx gives an all-zero block scale byte 0; spec has zero_scale={spec.zero_scale}")
    if spec.scale_rule not in TORCHAO_SCALE_RULES:
        return (f"torchao ScaleCalculationMode has {list(TORCHAO_SCALE_RULES)}; spec has "
                f"scale_rule={spec.scale_rule!r}")
    return None


def fp8_spec_refusal(spec: OperandSpec) -> str | None:
    """Why torchao's Float8 cast (tensorwise / axiswise) cannot produce ``spec``, or None."""
    if spec.scaling not in _FP8_FORMULAS:
        return f"torchao Float8 casts are tensorwise or rowwise; spec has scaling={spec.scaling!r}"
    if spec.fmt not in ("e4m3", "e5m2"):
        return f"torchao Float8Linear casts to e4m3 or e5m2 (fn types), not fmt={spec.fmt!r}"
    formula, pow2 = _FP8_FORMULAS[spec.scaling]
    if (spec.scale_formula, spec.power_of_2, spec.margin, spec.rounding) != (formula, pow2, 0, "rne"):
        return (f"torchao {spec.scaling} scaling is scale_formula={formula!r} power_of_2={pow2} margin=0 rne; "
                f"spec has {spec.scale_formula!r} power_of_2={spec.power_of_2} margin={spec.margin} "
                f"{spec.rounding!r}")
    return None


@dataclass(frozen=True)
class LinearPlan:
    """Which torchao linear runs a recipe: ``kind`` "mx" (mx_mm) or "float8" (Float8Linear);
    ``fmts`` are the mxcheck formats of input, weight, grad_output; ``mode`` is the
    ScaleCalculationMode value (mx) or the FP8 granularity (float8)."""

    kind: str
    fmts: tuple[str, str, str]
    mode: str

    def fmt(self, tensor: str) -> str:
        return self.fmts[list(_PAIRS).index(tensor)]


def _pair_specs(r: Recipe) -> dict[str, OperandSpec] | str:
    """input / weight / grad_output -> the one spec both its copies share, or why not."""
    out = {}
    for tensor, (fwd, bwd) in _PAIRS.items():
        if r.spec(fwd) != r.spec(bwd):
            return (f"recipe {r.name} quantizes {fwd} and {bwd} differently; torchao casts one {tensor} "
                    "config both ways")
        out[tensor] = r.spec(fwd)
    return out


def linear_plan(recipe: Recipe | str) -> LinearPlan | str:
    """The torchao linear that computes ``recipe`` bit for bit in its quantization, or why none does."""
    r = get_recipe(recipe)
    mx = all(r.spec(op).scaling == "mx" for op in OPERANDS)
    refusal = spec_refusal if mx else fp8_spec_refusal
    why: dict[str, list[str]] = {}  # reason -> the operands it applies to
    for op in OPERANDS:
        if (w := refusal(r.spec(op))) is not None:
            why.setdefault(w, []).append(op)
    if why:
        what = "torchao mx_mm (1x32 MX)" if mx else "torchao Float8Linear (tensorwise / rowwise)"
        return f"recipe {r.name}: {what}: " + "; ".join(f"{', '.join(ops)}: {w}" for w, ops in why.items())
    specs = _pair_specs(r)
    if isinstance(specs, str):
        return specs
    fmts = tuple(s.fmt for s in specs.values())
    if mx:
        if any(s.pad_to for s in specs.values()):
            return f"recipe {r.name} pads to {r.x_row.pad_to}; torchao mx_mm asserts whole 32-blocks instead"
        rules = {s.scale_rule for s in specs.values()}
        if len(rules) > 1:
            return f"recipe {r.name} mixes scale rules {sorted(rules)}; mx_mm takes one ScaleCalculationMode"
        return LinearPlan("mx", fmts, rules.pop())
    grans = {s.scaling for s in specs.values()}
    if len(grans) > 1 or fmts[:2] != ("e4m3", "e4m3"):
        return (f"recipe {r.name}: torchao's Float8 recipes (TENSORWISE, ROWWISE) use one granularity and e4m3 "
                f"input and weight; recipe has {sorted(grans)} and input/weight/grad_output {fmts}")
    if grans == {"row"} and fmts[2] != "e4m3":
        return f"recipe {r.name}: torchao ROWWISE casts grad_output to e4m3, recipe has {fmts[2]}"
    return LinearPlan("float8", fmts, grans.pop())

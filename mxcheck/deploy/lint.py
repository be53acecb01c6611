"""``mxcheck lint``: rules a Flux low-precision recipe and its launch environment must meet.

Each rule is one row of ``RULES``: an id, a severity, a one-line summary and one small check
(``mxcheck.deploy.checks``) that yields ``Hit``s (key, value, what is wrong, the fix). Rules
that read the launch environment run only when one is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mxcheck.deploy import checks as c
from mxcheck.deploy.checks import (
    ATTENTION_BACKENDS,
    AUTO_TUNE_ENV,
    MXFP4_BACKWARD_PRECISIONS,
    MXFP6_BACKWARD_PRECISIONS,
    MXFP6_FORMATS,
    MXFP6_TILE,
    Check,
    Context,
)
from mxcheck.deploy.recipe import BACKEND_ENV, Recipe

__all__ = [
    "RULES",
    "SEVERITIES",
    "Finding",
    "LintResult",
    "Rule",
    "lint",
]

SEVERITIES = ("error", "warning")


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    summary: str
    check: Check
    needs_env: bool = False


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    key: str
    value: str
    message: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "severity": self.severity, "key": self.key,
                "value": self.value, "message": self.message, "fix": self.fix}


# ---- the table -----------------------------------------------------------------------

_LOCAL_WHY = "Primus' MXFP4 linears reject anything else (primus_turbo_mxfp4_local.py guards)"

RULES: tuple[Rule, ...] = (
    Rule("MX001", "error", "fp4: mxfp4 needs fp4_recipe: mxfp4 (the default trains NVFP4)",
         c.fp4_recipe_mxfp4),
    Rule("MX002", "error", "MXFP4 local spec needs tensor_model_parallel_size 1",
         c.requires("tensor_model_parallel_size", 1, c.mxfp4_local, "the MXFP4 local spec",
                    _LOCAL_WHY)),
    Rule("MX003", "error", "MXFP4 local spec needs gradient_accumulation_fusion false",
         c.requires("gradient_accumulation_fusion", False, c.mxfp4_local, "the MXFP4 local spec",
                    _LOCAL_WHY + "; Megatron's default is true")),
    Rule("MX004", "error", "MXFP4 local spec needs sequence_parallel false",
         c.requires("sequence_parallel", False, c.mxfp4_local, "the MXFP4 local spec", _LOCAL_WHY)),
    Rule("MX005", "error", "MXFP4 local spec needs enable_primus_turbo true",
         c.requires("enable_primus_turbo", True, c.mxfp4_local, "the MXFP4 local spec",
                    "without Primus-Turbo the local spec has no MXFP4 GEMM and runs BF16")),
    Rule("MX006", "error", "fp6 excludes fp4",
         c.excludes_fp6("fp4", lambda v: v is not None,
                        "the layer spec selects one linear implementation per model",
                        "drop fp4 (or fp6)")),
    Rule("MX007", "error", "fp6 excludes fp8",
         c.excludes_fp6("fp8", lambda v: v is not None,
                        "mirrors Megatron's fp4/fp8 exclusion",
                        "drop fp8; for an FP8 backward use mxfp6_backward_precision: fp8")),
    Rule("MX008", "error", "fp6 excludes mxfp4_to_fp8_switch_iter > 0",
         c.excludes_fp6("mxfp4_to_fp8_switch_iter", lambda v: isinstance(v, int) and v > 0,
                        "the switch converts MXFP4 linears, of which an MXFP6 model has none",
                        "set mxfp4_to_fp8_switch_iter: 0; use mxfp6_backward_precision: fp8")),
    Rule("MX009", "error", "fp6 is one of " + ", ".join(MXFP6_FORMATS),
         c.one_of("fp6", MXFP6_FORMATS, "BaseDiffusionConfig raises Unknown fp6")),
    Rule("MX010", "error", "mxfp6_backward_precision is one of "
         + ", ".join(MXFP6_BACKWARD_PRECISIONS),
         c.one_of("mxfp6_backward_precision", MXFP6_BACKWARD_PRECISIONS,
                  "BaseDiffusionConfig raises Unknown mxfp6_backward_precision")),
    Rule("MX011", "error", "a non-default mxfp6_backward_precision needs fp6",
         c.needs_format("mxfp6_backward_precision", "fp6", c.fp6,
                        "BaseDiffusionConfig raises (requires fp6 to be set)")),
    Rule("MX012", "error", "mxfp4_backward_precision is one of "
         + ", ".join(MXFP4_BACKWARD_PRECISIONS),
         c.one_of("mxfp4_backward_precision", MXFP4_BACKWARD_PRECISIONS,
                  "only the pure and the FP8-hybrid backward exist")),
    Rule("MX013", "warning", "a non-default mxfp4_backward_precision needs fp4: mxfp4",
         c.needs_format("mxfp4_backward_precision", "fp4", c.mxfp4,
                        "no MXFP4 linear reads it, so the setting is inert")),
    Rule("MX014", "error", f"MXFP6 GEMMs need M, N, K multiples of {MXFP6_TILE} at the "
         "recipe's micro batch and tokens", c.mxfp6_tiles),
    Rule("MX015", "error", f"MXFP4 local spec needs {BACKEND_ENV} to pin FP4 to AITER",
         c.fp4_pinned_to_aiter, needs_env=True),
    Rule("MX016", "error", f"MXFP4 local spec needs {AUTO_TUNE_ENV} unset",
         c.autotune_off_for_mxfp4, needs_env=True),
    Rule("MX017", "warning", f"FP8 local spec wants {AUTO_TUNE_ENV}=1", c.fp8_autotuned,
         needs_env=True),
    Rule("MX018", "warning", "FP8 local spec wants the FP8 GEMM backend not pinned",
         c.fp8_not_pinned, needs_env=True),
    Rule("MX019", "error", f"{BACKEND_ENV}, when set, is non-empty and parses",
         c.backend_env_parses, needs_env=True),
    Rule("MX020", "error", "attention_backend is one of " + ", ".join(ATTENTION_BACKENDS),
         c.one_of("attention_backend", ATTENTION_BACKENDS,
                  "Megatron's AttnBackend has no such member")),
    Rule("MX021", "error", "TE-native FP4 autocast cannot run under torch.compile",
         c.te_fp4_not_compiled),
    Rule("MX022", "warning", "optimizer dtypes (main_grads_dtype, ...) need "
         "use_precision_aware_optimizer", c.dtypes_need_precision_aware),
    Rule("MX023", "error", "mxfp6_fused_wgrad_accum needs one microbatch per step",
         c.fused_wgrad_one_microbatch),
    Rule("MX024", "error", "mxfp6_fused_wgrad_accum needs bf16 main grads",
         c.fused_wgrad_bf16_main_grads),
    Rule("MX025", "error", "mxfp6_fused_wgrad_accum needs the pure MXFP6 backward",
         c.requires("mxfp6_backward_precision", "mxfp6", c.fused_wgrad, "mxfp6_fused_wgrad_accum",
                    "the fused store is the A6W6 wgrad GEMM's; the FP8 backward has none")),
)


# ---- running the table ---------------------------------------------------------------


@dataclass(frozen=True)
class LintResult:
    recipe: Recipe
    findings: tuple[Finding, ...]
    rules_run: tuple[str, ...]
    rules_skipped: tuple[str, ...]  # environment rules, when no environment was given

    @property
    def errors(self) -> int:
        return sum(f.severity == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == "warning" for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe.source, "model": self.recipe.model,
                "env_checked": not self.rules_skipped, "errors": self.errors,
                "warnings": self.warnings, "rules_run": list(self.rules_run),
                "rules_skipped": list(self.rules_skipped),
                "findings": [f.to_json() for f in self.findings]}

    def to_text(self) -> str:
        head = (f"{self.recipe.source}: {self.errors} error(s), {self.warnings} warning(s) "
                f"from {len(self.rules_run)} rules")
        if self.rules_skipped:
            head += (f"; {len(self.rules_skipped)} environment rules not run "
                     f"({', '.join(self.rules_skipped)}): pass --env or --env-file")
        lines = [head]
        for f in self.findings:
            lines.append(f"  {f.rule} {f.severity:<7} {f.key} = {f.value}")
            lines.append(f"        {f.message}")
            lines.append(f"        fix: {f.fix}")
        return "\n".join(lines) + "\n"


def lint(recipe: Recipe, env: Mapping[str, str] | None = None, *, txt_tokens: int = 256,
         dp_size: int | None = None, rules: tuple[Rule, ...] = RULES) -> LintResult:
    """Run ``rules`` on ``recipe``; environment rules only when ``env`` is given."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe={recipe!r}: expected a Recipe (see load_recipe)")
    for name, value in (("txt_tokens", txt_tokens), ("dp_size", dp_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name}={value!r}: expected a positive int")
    ctx = Context(recipe, env, txt_tokens, dp_size)
    findings, run, skipped = [], [], []
    for rule in rules:
        if rule.needs_env and env is None:
            skipped.append(rule.id)
            continue
        run.append(rule.id)
        findings += [Finding(rule.id, rule.severity, h.key, h.value, h.message, h.fix)
                     for h in rule.check(ctx)]
    return LintResult(recipe, tuple(findings), tuple(run), tuple(skipped))

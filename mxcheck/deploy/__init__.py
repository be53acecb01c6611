"""Deployment checks: recipe lint, tuned-GEMM coverage and the AITER tuned-config log audit."""

from mxcheck.deploy.lint import RULES, Finding, LintResult, Rule, lint
from mxcheck.deploy.recipe import Recipe, load_recipe, parse_backend_env, parse_env_file
from mxcheck.deploy.tuned import (
    Coverage,
    LogAudit,
    TunedTable,
    aiter_padded_m,
    audit_log,
    read_tuned_csv,
    tuned_coverage,
)

__all__ = [
    "RULES",
    "Coverage",
    "Finding",
    "LintResult",
    "LogAudit",
    "Recipe",
    "Rule",
    "TunedTable",
    "aiter_padded_m",
    "audit_log",
    "lint",
    "load_recipe",
    "parse_backend_env",
    "parse_env_file",
    "read_tuned_csv",
    "tuned_coverage",
]

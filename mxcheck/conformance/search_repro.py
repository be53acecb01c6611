"""A search finding written as a reproducer: a directory with a script that runs alone.

``repro.py`` holds the input as a literal (small tensors) or loads ``input.pt`` beside it,
names the backend factory, the recipe and the property, and calls
``mxcheck.conformance.search.judge``: the same comparison with the oracle the search made.
It prints the difference and exits 1 while the backend still differs, 0 once it agrees.
``finding.txt`` holds the failure text and the input's size.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from mxcheck.conformance.search import Finding

__all__ = ["LITERAL_LIMIT", "write_reproducer"]

LITERAL_LIMIT = 1024  # elements per tensor written into the script; larger ones go to input.pt

_SCRIPT = '''"""mxcheck search reproducer: {title}.

Run it alone (python repro.py): exit 1 and the difference while the backend differs from the
oracle on this input, exit 0 once it agrees. Found by `mxcheck search` (seed {seed}).
"""

import sys
{imports}
import torch

from mxcheck.backends import get
from mxcheck.conformance.search import judge

nan, inf = float("nan"), float("inf")
BACKEND = {backend!r}  # the backend factory, as `mxcheck search --backend` takes it
RECIPE = {recipe!r}  # a built-in name, a recipe file or FILE@PROFILE
PROPERTY = {prop!r}  # {what}
OPERAND = {operand!r}
KNOWN = {known!r}  # behaviours taken as the oracle's own (known before this finding)

{tensors}
message = judge(PROPERTY, get(BACKEND), RECIPE, tensors, operand=OPERAND, known=KNOWN)
if message:
    print(message)
    sys.exit(1)
print(f"{{BACKEND}} agrees with the oracle on this input ({{PROPERTY}}, recipe {{RECIPE}})")
'''

_WHAT = {
    "quantize": "the backend's quantize of OPERAND equals the oracle's, bit for bit, in every field",
    "gemm": "the backend's gemm of the oracle's operands lies in the fp32-accumulation bound of the exact GEMM",
    "linear": "the backend's linear forward lies in that bound around the exact GEMM plus the bias",
}


def _literal(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)  # float64 repr is exact, and every float32/bf16/fp16 value is a float64


def _tensor_code(name: str, t: torch.Tensor) -> str:
    dtype = f"torch.{str(t.dtype).removeprefix('torch.')}"
    values = [_literal(v) for v in t.double().reshape(-1).tolist()]
    rows = [", ".join(values[i:i + 8]) for i in range(0, len(values), 8)]
    body = ",\n    ".join(rows)
    return (f"{name} = torch.tensor([\n    {body},\n], dtype=torch.float64).to({dtype}).reshape"
            f"{tuple(t.shape)}")


def write_reproducer(finding: Finding, factory: str, recipe: str, out: Path, *, seed: int = 0,
                     recipe_name: str | None = None, index: int = 0) -> Path:
    """Write ``finding`` under ``out/<factory>-<recipe name>-<property>[-<index>]/`` and return
    that directory. ``factory``: the backend's factory spec ``repro.py`` passes to
    ``mxcheck.backends.get``; ``recipe``: what it passes as the recipe (a name, a recipe
    file's absolute path, FILE@PROFILE), ``recipe_name`` its name (default ``recipe``);
    ``index``: the finding's number among its property's (from 0; the first has no suffix)."""
    stem = f"{factory.rpartition(':')[2]}-{recipe_name or recipe}-{finding.prop}" + (f"-{index + 1}" if index else "")
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "_", stem)
    where = Path(out) / name
    where.mkdir(parents=True, exist_ok=True)
    tensors = finding.case.tensors
    if all(t.numel() <= LITERAL_LIMIT for t in tensors.values()):
        code = "\n".join(_tensor_code(f"_{n}", t) for n, t in tensors.items())
        code += "\ntensors = {" + ", ".join(f"{n!r}: _{n}" for n in tensors) + "}\n"
        (where / "input.pt").unlink(missing_ok=True)
    else:
        torch.save({n: t.clone() for n, t in tensors.items()}, where / "input.pt")
        code = 'tensors = torch.load(Path(__file__).with_name("input.pt"))\n'
    imports = "from pathlib import Path\n" if (where / "input.pt").exists() else ""
    title = f"{finding.prop} of backend {factory} on recipe {recipe} ({finding.case.label})"
    (where / "repro.py").write_text(_SCRIPT.format(
        title=title, seed=seed, imports=imports, backend=factory, recipe=recipe, prop=finding.prop, what=_WHAT[finding.prop],
        operand=finding.case.operand, known=list(finding.known), tensors=code), encoding="utf-8")
    size = json.dumps(finding.size)
    cause = f"cause: {finding.cause.describe()}\n" if finding.cause is not None else ""
    (where / "finding.txt").write_text(f"{title}\ninput: {size}\n{cause}\n{finding.message}\n", encoding="utf-8")
    return where

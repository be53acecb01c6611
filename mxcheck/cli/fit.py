"""``mxcheck fit``: the profile that reproduces a backend's quantizer, and a recipe file pinning it.

It quantizes the quantize check's inputs (every input family and tensor dtype) with the
backend (on its device; codes from ``quantize``, else values from ``fake_quantize``) and the
oracle, fits one profile per operand spec of x_row and w_row
(``mxcheck.diagnose.fit``), prints each as ``NAME = profile(field=value, ...) + residual N
blocks``, and with ``--write`` writes a recipe file whose x_row and w_row state the fitted
profile inline: ``mxcheck conform --recipe FILE`` then gates on the residual alone. A spec
the backend refuses (``Refusal``) is printed as a declared skip with its reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from mxcheck.cli.common import CommandError, add_json_flag, out

__all__ = ["fit_args", "run_fit", "write_recipe"]


def fit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", required=True, metavar="NAME|pkg.mod:factory",
                   help="the backend whose quantizer to fit: a registered name or 'pkg.module:factory'")
    p.add_argument("--recipe", required=True, metavar="NAME|FILE",
                   help="the recipe it claims: a built-in name or a .yaml/.toml recipe file")
    p.add_argument("--write", type=Path, metavar="FILE.yaml",
                   help="write a recipe file pinning the fitted profiles (x_row, w_row)")
    p.add_argument("--seed", type=int, default=0, metavar="INT", help="seed of the inputs. Default: %(default)r")
    add_json_flag(p)


def _spec_table(spec: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    defaults = type(spec)()
    return {"fmt": spec.fmt, **{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name not in (
        *skip, "profile", "fmt") and getattr(spec, f.name) != getattr(defaults, f.name)}}


def write_recipe(path: Path, recipe: Any, fits: list[Any]) -> None:
    """A recipe file: the recipe's operand specs, x_row and w_row pinned to their fitted
    profile (every field inline), and every other copy with the same spec pinned to the same;
    failures, which no profile field states, in its notes."""
    from mxcheck.recipe_files import profile_table  # noqa: PLC0415
    from mxcheck.recipes import OPERANDS  # noqa: PLC0415

    pinned = {op: f for f in fits if f.fit is not None for op in f.operands}
    # a copy the fit did not run on (x_col, w_col, the gradients) whose spec is a fitted one's is
    # the same quantizer: pinned too, so a library that casts one config both ways (torchao)
    # does not refuse the file for quantizing x_row and x_col differently
    shared = {op: f for op in OPERANDS if op not in pinned
              for f in fits if f.fit is not None and f.spec == recipe.spec(op)}
    data: dict[str, Any] = {"name": f"{recipe.name}.fitted", "source": f"mxcheck fit of recipe {recipe.name}",
                            "out_dtype": str(recipe.out_dtype).removeprefix("torch.")}
    notes = []
    for op in OPERANDS:
        spec = recipe.spec(op)
        if op in pinned or op in shared:
            f = pinned.get(op) or shared[op]
            p = dataclasses.replace(f.fit.profile(f"{recipe.name}.{'+'.join(f.operands)}.fitted"), fmt=spec.fmt)
            data[op] = {**_spec_table(spec, p.spec_fields), "profile": profile_table(p)}
            if op in shared:
                notes += [f"{op}: the spec of {'+'.join(f.operands)}, pinned to its fit"]
                continue
            notes += [f"{op}: residual {f.fit.residual} of {f.fit.blocks} blocks on the quantize check's inputs"]
            notes += [f"{op}: {n}" for n in p.notes]
        else:
            data[op] = _spec_table(spec)
    data["notes"] = notes
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=120))


def run_fit(args: argparse.Namespace) -> int:
    from mxcheck import backends  # noqa: PLC0415
    from mxcheck.conformance.fitting import fit_backend  # noqa: PLC0415
    from mxcheck.recipe_files import resolve_recipe  # noqa: PLC0415

    try:
        recipe = resolve_recipe(args.recipe)
        backend = backends.get(args.backend)
    except (ValueError, TypeError, ImportError) as e:
        raise CommandError(str(e)) from None
    if why := _not_here(backend, recipe):
        out(f"mxcheck fit: backend {args.backend}: {why}; nothing was fitted\n")
        return 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many small quantizations: threads only wait on each other
    try:
        start = time.process_time()
        fits = fit_backend(backend, recipe, seed=args.seed)
        cpu = time.process_time() - start
    finally:
        torch.set_num_threads(threads)
    rows = []
    for f in fits:
        name = f"{recipe.name} {'+'.join(f.operands)}"
        if f.refused:
            text = f"{name}: refused by the backend (declared), not fitted: {f.refused}"
        elif f.fit is None:
            text = f"{name}: profiles cannot model this spec (2D tiles, padding, SR or a scaling with no profile kind)"
        else:
            text = f.fit.text(name)
        rows.append({"operands": list(f.operands), "text": text, "refused": f.refused or None,
                     "fields": None if f.fit is None else {k: v for k, v in f.fit.fields.items()},
                     "failures": None if f.fit is None else [b.key for b in f.fit.failures],
                     "residual": None if f.fit is None else f.fit.residual,
                     "blocks": None if f.fit is None else f.fit.blocks})
    if args.write:
        write_recipe(args.write, recipe, fits)
    if args.json:
        out(json.dumps({"recipe": recipe.name, "backend": args.backend, "cpu_s": round(cpu, 2), "fits": rows},
                       indent=2, default=str) + "\n")
    else:
        out("".join(r["text"] + "\n" for r in rows) + f"({cpu:.1f} s CPU)\n")
        if args.write:
            out(f"wrote {args.write}\n")
    if all(f.refused for f in fits):  # a backend that refused everything must not read as fitted
        out("mxcheck fit: nothing was fitted (the backend refused every operand spec; the reasons are above)\n")
        return 1
    return 0


def _not_here(backend: Any, recipe: Any) -> str:
    """Why the backend cannot be fitted on ``recipe`` here (unavailable, unsupported, no
    quantizer), or ""."""
    ok, why = backend.available() if hasattr(backend, "available") else (True, "")
    if not ok:
        return f"not available here ({why or 'no reason given'})"
    ok, why = backend.supports(recipe) if hasattr(backend, "supports") else (True, "")
    if not ok:
        return f"does not support recipe {recipe.name} ({why or 'no reason given'})"
    if not hasattr(backend, "quantize") and not hasattr(backend, "fake_quantize"):
        return "has neither quantize nor fake_quantize"
    return ""

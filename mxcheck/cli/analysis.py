"""Measurements: ``mxcheck divergence`` (where two profiles give different bits),
``mxcheck stats`` (per-block statistics of a quantized operand) and ``mxcheck thresholds``
(measured SNR against the suite's floors). Each result renders itself, in
``mxcheck.divergence``, ``mxcheck.stats`` and ``mxcheck.thresholds``."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from mxcheck.cli.common import CommandError, add_json_flag, out, positive_int, to_json

__all__ = ["divergence_args", "run_divergence", "run_stats", "run_thresholds", "stats_args",
           "thresholds_args"]


# ---- divergence ---------------------------------------------------------------------


def divergence_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", nargs="?", metavar="A", help="a profile, e.g. primus_turbo.mxfp4")
    p.add_argument("b", nargs="?", metavar="B", help="the profile to compare it with, e.g. ocp")
    p.add_argument("--fmt", metavar="FMT", help="the element format where both profiles are "
                   "families (ocp, torchao.floor, ...). Default: %(default)r")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the generated inputs. Default: %(default)r")
    p.add_argument("--table", action="store_true", help="print how mxcheck reaches each case of "
                   "reference_emulators.md section 8 instead. Default: %(default)r")
    add_json_flag(p)


def run_divergence(args: argparse.Namespace) -> int:
    from mxcheck import divergence  # noqa: PLC0415  (generates inputs only when asked)
    from mxcheck.profiles import PROFILES  # noqa: PLC0415

    if args.table:
        out(to_json(divergence.table_json()) if args.json else divergence.table_text())
        return 0
    known = f"known profiles: {', '.join(PROFILES)}"
    if args.a is None or args.b is None:
        raise CommandError(f"give two profiles A B (or --table); {known}")
    for name in (args.a, args.b):
        if name not in PROFILES:
            raise CommandError(f"unknown profile {name!r}; {known}")
    try:
        report = divergence.divergence(args.a, args.b, seed=args.seed, fmt=args.fmt)
    except ValueError as e:  # two pinned formats, a family pair without --fmt, a bad --fmt
        raise CommandError(str(e)) from None
    out(to_json(report.to_json()) if args.json else report.to_text())
    return 0


# ---- stats ----------------------------------------------------------------------------


def _shape_arg(text: str) -> tuple[int, int]:
    rows, _, cols = text.lower().partition("x")
    try:
        shape = int(rows), int(cols)
    except ValueError:
        shape = 0, 0
    if min(shape) < 1:
        raise argparse.ArgumentTypeError(f"shape must be ROWSxCOLS with positive integers "
                                         f"(e.g. 256x3072), got {text!r}")
    return shape


def stats_args(p: argparse.ArgumentParser) -> None:
    from mxcheck.recipes import OPERANDS, RECIPES  # noqa: PLC0415
    from mxcheck.stats import DISTRIBUTIONS  # noqa: PLC0415

    p.add_argument("--recipe", default="mxfp4", choices=list(RECIPES), metavar="NAME",
                   help=f"one of {', '.join(RECIPES)}. Default: %(default)r")
    p.add_argument("--operand", default="x_row", choices=OPERANDS, metavar="OPERAND",
                   help=f"the operand copy whose spec to use: {', '.join(OPERANDS)}. "
                        "Default: %(default)r")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--shape", type=_shape_arg, default="256x3072", metavar="ROWSxCOLS",
                     help="shape of a synthetic float32 operand (COLS is the contraction axis). "
                          "Default: %(default)r")
    src.add_argument("--pt", type=Path, metavar="FILE.pt",
                     help="a tensor or a dict of tensors saved with torch.save (each viewed as "
                          "[-1, last dim]; float64 read as float32)")
    p.add_argument("--key", metavar="NAME", help="with --pt holding a dict: only this entry")
    p.add_argument("--dist", default="normal", choices=list(DISTRIBUTIONS), metavar="DIST",
                   help=f"distribution of the synthetic operand: {', '.join(DISTRIBUTIONS)}. "
                        "Default: %(default)r")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the synthetic operand and of stochastic-rounding bits. "
                        "Default: %(default)r")
    add_json_flag(p)


def _as_operand(name: str, t: torch.Tensor) -> torch.Tensor:
    if not t.dtype.is_floating_point or t.ndim == 0:
        raise CommandError(f"{name}: a {t.dtype} tensor of shape {tuple(t.shape)}; expected a "
                           "floating-point tensor of at least 1 dim")
    t = t.detach().reshape(-1, t.shape[-1])
    return t.float() if t.dtype == torch.float64 else t


def _stats_tensors(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """name -> 2D operand: the synthetic one, or the tensor(s) of the --pt file."""
    from mxcheck.stats import synthetic  # noqa: PLC0415

    if args.pt is None:
        if args.key is not None:
            raise CommandError(f"--key {args.key!r} selects an entry of a --pt file; give --pt FILE.pt")
        rows, cols = args.shape
        return {f"{args.dist} {rows}x{cols}": synthetic(args.shape, args.dist, seed=args.seed)}
    try:
        data = torch.load(args.pt, map_location="cpu", weights_only=True)
    except OSError as e:
        raise CommandError(f"{args.pt}: cannot read: {e.strerror or e}") from None
    except Exception as e:  # pickle and torch errors: not a file of plain tensors
        raise CommandError(f"{args.pt}: not a torch.save file of tensors ({type(e).__name__}: {e})") \
            from None
    if isinstance(data, torch.Tensor):
        if args.key is not None:
            raise CommandError(f"{args.pt} holds one tensor, not a dict: drop --key {args.key!r}")
        return {args.pt.name: _as_operand(args.pt.name, data)}
    if not isinstance(data, dict):
        raise CommandError(f"{args.pt} holds a {type(data).__name__}; expected a tensor or a dict of tensors")
    tensors = {str(k): v for k, v in data.items() if isinstance(v, torch.Tensor)}
    if args.key is not None:
        if args.key not in tensors:
            raise CommandError(f"--key {args.key!r} is not a tensor in {args.pt}; it has {sorted(tensors)}")
        tensors = {args.key: tensors[args.key]}
    if not tensors:
        raise CommandError(f"{args.pt}: the dict holds no tensors (keys {sorted(map(str, data))})")
    return {k: _as_operand(k, v) for k, v in tensors.items()}


def run_stats(args: argparse.Namespace) -> int:
    from mxcheck.recipes import get_recipe  # noqa: PLC0415
    from mxcheck.scaling import DelayedScaling  # noqa: PLC0415
    from mxcheck.stats import block_stats  # noqa: PLC0415

    spec = get_recipe(args.recipe).spec(args.operand)
    if not spec.quantized:
        raise CommandError(f"recipe {args.recipe} keeps {args.operand} in {spec.fmt} (scaling 'none'): "
                           "it has no blocks or scales")
    results = {}
    for name, t in _stats_tensors(args).items():
        state = None
        if spec.scaling == "delayed":
            # A history holding this tensor's own amax: delayed scaling's steady state.
            state = DelayedScaling(spec.fmt, margin=spec.margin)
            state.quantize(t)
        try:
            results[name] = block_stats(t, spec, generator=torch.Generator().manual_seed(args.seed),
                                        state=state)
        except (TypeError, ValueError) as e:  # a dtype or shape the spec cannot take
            raise CommandError(f"{name}: {e}") from None
    if args.json:
        out(to_json({"recipe": args.recipe, "operand": args.operand,
                     "tensors": {k: s.to_json() for k, s in results.items()}}))
        return 0
    head = (f"recipe {args.recipe} operand {args.operand}: {spec.fmt} {spec.scaling}"
            + (f" scale rule {spec.scale_rule}" if spec.scaling == "mx" else "")
            + (f" hadamard {spec.hadamard}" if spec.hadamard else "") + "\n")
    out(head + "".join(s.to_text(k) for k, s in results.items()))
    return 0


# ---- thresholds ------------------------------------------------------------------------


def thresholds_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", type=positive_int("k"), nargs="+", default=[256, 3072, 12288], metavar="K",
                   help="contraction lengths to measure. Default: %(default)r")
    p.add_argument("--fmt", nargs="+", default=["e2m1", "e2m3", "e3m2", "e4m3", "e5m2"], metavar="FMT",
                   help="MX element formats. Default: %(default)r")
    p.add_argument("--rows", type=positive_int("rows"), default=128, metavar="N",
                   help="rows of each randn operand. Default: %(default)r")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="input seed. Default: %(default)r")
    add_json_flag(p)


def run_thresholds(args: argparse.Namespace) -> int:
    from mxcheck import thresholds as th  # noqa: PLC0415

    try:
        rows = th.threshold_table(tuple(args.fmt), ks=tuple(args.k), rows=args.rows, seed=args.seed)
    except ValueError as e:
        raise CommandError(str(e)) from None
    out(to_json(th.thresholds_json(rows)) if args.json
        else th.thresholds_text(rows, n_rows=args.rows, seed=args.seed))
    return 0

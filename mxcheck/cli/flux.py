"""Flux commands: ``mxcheck shapes`` (every linear's GEMMs; rendered by
``mxcheck.flux.shapes``) and ``mxcheck sweep`` (every unique shape through each recipe)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mxcheck.cli.common import (
    CommandError,
    add_json_flag,
    add_token_args,
    out,
    positive_int,
    progress,
    to_json,
    write_text,
)
from mxcheck.report import render_html, render_markdown

__all__ = ["run_shapes", "run_sweep_command", "shapes_args", "sweep_args"]


def shapes_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="flux-12b", metavar="NAME",
                   help="a Flux config (flux-12b, flux-12b-schnell, flux-535m, ...). Default: %(default)r")
    p.add_argument("--mbs", type=positive_int("mbs"), default=64, metavar="N",
                   help="micro batch size. Default: %(default)r")
    add_token_args(p)
    p.add_argument("--all", action="store_true", help="list every linear, not only those a "
                   "Primus local spec quantizes. Default: %(default)r")
    choice = p.add_mutually_exclusive_group()
    choice.add_argument("--csv", action="store_true", help="CSV: layer,stream,direction,M,N,K. "
                        "Default: %(default)r")
    add_json_flag(choice)


def run_shapes(args: argparse.Namespace) -> int:
    from mxcheck.flux import flux_linear_shapes, shapes_csv  # noqa: PLC0415
    from mxcheck.flux.shapes import shapes_json, shapes_text  # noqa: PLC0415

    try:
        rows = flux_linear_shapes(args.model, args.mbs, args.img_tokens, args.txt_tokens,
                                  replaced_only=not args.all)
    except ValueError as e:
        raise CommandError(str(e)) from None
    if args.csv:
        out(shapes_csv(rows))
    elif args.json:
        out(to_json(shapes_json(rows)))
    else:
        out(f"{args.model}, micro batch {args.mbs}, {args.img_tokens} image + {args.txt_tokens} "
            f"text tokens: {shapes_text(rows)}")
    return 0


def sweep_args(p: argparse.ArgumentParser) -> None:
    from mxcheck.sweep import DEFAULT_RECIPES  # noqa: PLC0415

    p.add_argument("--model", default="flux-12b", metavar="NAME",
                   help="a Flux config. Default: %(default)r")
    p.add_argument("--recipes", nargs="+", default=list(DEFAULT_RECIPES), metavar="RECIPE",
                   help="recipes to run. Default: %(default)r")
    p.add_argument("--backend", default="auto", metavar="NAME",
                   help="a backend name, 'pkg.module:factory', or auto (per recipe the first "
                        "usable of triton, torch, emulated). Default: %(default)r")
    p.add_argument("--mbs", type=positive_int("mbs"), default=64, metavar="N",
                   help="micro batch size. Default: %(default)r")
    p.add_argument("--tokens", type=positive_int("tokens"), metavar="N",
                   help="force M of every linear (default: the shape table's M on a GPU, "
                        "256 on a CPU)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write sweep.json, sweep.md and sweep.html (needs matplotlib) here")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="input seed. Default: %(default)r")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr. Default: %(default)r")


def run_sweep_command(args: argparse.Namespace) -> int:
    from mxcheck.backends import BackendLoadError  # noqa: PLC0415
    from mxcheck.sweep import run_sweep  # noqa: PLC0415

    say = lambda msg: progress("sweep", msg, args.quiet)  # noqa: E731
    try:
        report = run_sweep(args.model, args.recipes, args.backend, batch=args.mbs, tokens=args.tokens,
                           seed=args.seed, progress=say)
    except (ValueError, BackendLoadError) as e:
        raise CommandError(str(e)) from None
    md = render_markdown(report)
    if args.out is None:
        out(md)
    else:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CommandError(f"{args.out}: cannot create: {e.strerror or e}") from None
        report.save(args.out / "sweep.json")
        write_text(args.out / "sweep.md", md)
        try:
            write_text(args.out / "sweep.html", render_html(report))
        except ImportError as e:
            say(f"no HTML: {e}")
        say(f"wrote {args.out}/sweep.{{json,md,html}}")
    failed = [r for r in report.records if not r.passed]
    say(f"{len(report.records)} records, {len(failed)} failed, {len(report.skipped)} skipped, "
        f"{report.environment['sweep']['wall_s']} s")
    return 1 if failed else 0

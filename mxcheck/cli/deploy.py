"""The deployment checks: ``mxcheck lint``, ``tuned-coverage`` and ``aiter-log``. Each
result renders itself (``to_text``/``to_json`` in ``mxcheck.deploy``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mxcheck.cli.common import (
    CommandError,
    add_json_flag,
    add_token_args,
    out,
    positive_int,
    read_text,
    to_json,
)

__all__ = ["aiter_log_args", "lint_args", "run_aiter_log", "run_lint", "run_tuned_coverage",
           "tuned_coverage_args"]


def lint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", type=Path, metavar="RECIPE.yaml",
                   help="a Primus experiment YAML (modules.pre_trainer.overrides) or a flat one")
    env = p.add_mutually_exclusive_group()
    env.add_argument("--env", action="store_true",
                     help="also check this process's environment. Default: %(default)r")
    env.add_argument("--env-file", type=Path, metavar="FILE",
                     help="also check the KEY=VALUE lines of FILE as the launch environment")
    p.add_argument("--txt-tokens", type=positive_int("txt-tokens"), default=256, metavar="N",
                   help="text tokens of seq_length (the rest are image tokens). "
                        "Default: %(default)r")
    p.add_argument("--dp-size", type=positive_int("dp-size"), metavar="N",
                   help="data-parallel size, for the one-microbatch rule (else from "
                        "data_parallel_size, WORLD_SIZE or NNODES x GPUS_PER_NODE)")
    add_json_flag(p)


def run_lint(args: argparse.Namespace) -> int:
    from mxcheck.deploy import lint, load_recipe, parse_env_file  # noqa: PLC0415

    env: dict[str, str] | None = dict(os.environ) if args.env else None
    if args.env_file is not None:
        try:
            env = parse_env_file(read_text(args.env_file, "env file"), source=str(args.env_file))
        except ValueError as e:
            raise CommandError(str(e)) from None
    try:
        recipe = load_recipe(args.recipe, env)
    except OSError as e:
        raise CommandError(f"{args.recipe}: cannot read recipe: {e.strerror or e}") from None
    except ValueError as e:
        raise CommandError(str(e)) from None
    result = lint(recipe, env, txt_tokens=args.txt_tokens, dp_size=args.dp_size)
    out(to_json(result.to_json()) if args.json else result.to_text())
    return result.exit_code


def tuned_coverage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("csv", type=Path, metavar="CSV", help="an AITER tuned GEMM CSV "
                   "(gfx,cu_num,M,N,K,kernelId,splitK,us,kernelName,...)")
    p.add_argument("--model", default="flux-12b", metavar="NAME",
                   help="flux-12b, flux-12b-schnell or flux-535m. Default: %(default)r")
    p.add_argument("--mbs", type=positive_int("mbs"), required=True, metavar="N",
                   help="micro batch size")
    p.add_argument("--cu-num", type=positive_int("cu-num"), default=256, metavar="N",
                   help="compute units of the GPU (MI355X: 256). Default: %(default)r")
    p.add_argument("--gfx", default="gfx950", metavar="ARCH",
                   help="GPU arch, matched where the CSV has a gfx column. Default: %(default)r")
    add_token_args(p)
    add_json_flag(p)


def run_tuned_coverage(args: argparse.Namespace) -> int:
    from mxcheck.deploy import read_tuned_csv, tuned_coverage  # noqa: PLC0415

    try:
        table = read_tuned_csv(read_text(args.csv, "tuned CSV"), source=str(args.csv))
        coverage = tuned_coverage(table, args.model, args.mbs, img_tokens=args.img_tokens,
                                  txt_tokens=args.txt_tokens, cu_num=args.cu_num, gfx=args.gfx)
    except ValueError as e:  # a malformed CSV, an unknown model
        raise CommandError(str(e)) from None
    out(to_json(coverage.to_json()) if args.json else coverage.to_text())
    return coverage.exit_code


def aiter_log_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", type=Path, metavar="LOG", help="a training log with AITER's "
                   "tuned-config lines (hits need AITER_LOG_TUNED_CONFIG=1)")
    add_json_flag(p)


def run_aiter_log(args: argparse.Namespace) -> int:
    from mxcheck.deploy import audit_log  # noqa: PLC0415

    audit = audit_log(read_text(args.log, "log").splitlines(), source=str(args.log))
    out(to_json(audit.to_json()) if args.json else audit.to_text())
    return audit.exit_code

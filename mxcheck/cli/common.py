"""What every ``mxcheck`` subcommand shares: the user-error type, option converters and
adders (some shared with the pytest plugin's ``--mxcheck-*`` options), and output helpers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mxcheck.report import Report, ReportError
from mxcheck.report.compare import DEFAULT_MAX_DROP_DB

__all__ = [
    "PROG",
    "CommandError",
    "add_allow_incomplete_option",
    "add_json_flag",
    "add_max_drop_option",
    "add_token_args",
    "load_report",
    "out",
    "parse_max_drop_db",
    "positive_int",
    "progress",
    "read_text",
    "to_json",
    "write_text",
]

PROG = "mxcheck"


class CommandError(Exception):
    """A failure the user can fix (bad file, bad environment): one line, exit code 2."""


# ---- option converters and adders ----------------------------------------------------


def parse_max_drop_db(text: str) -> float:
    """A dB margin: a finite number >= 0. The error names the bad value."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"max-drop-db must be a number of dB >= 0, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"max-drop-db must be finite, got {value!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"max-drop-db must be >= 0, got {value!r}")
    return value


def add_allow_incomplete_option(addoption: Callable[..., Any], prefix: str = "--") -> None:
    """``{prefix}allow-incomplete-baseline``: through ``add_argument`` or pytest's ``addoption``."""
    addoption(f"{prefix}allow-incomplete-baseline", action="store_true", default=False,
              help="accept a baseline report whose run did not finish (complete: false, e.g. "
                   "cancelled); its missing checks then read as new. Default: %(default)r")


def add_max_drop_option(addoption: Callable[..., Any], prefix: str = "--") -> None:
    """``{prefix}max-drop-db``: through ``parser.add_argument`` or pytest's ``addoption``."""
    addoption(f"{prefix}max-drop-db", type=parse_max_drop_db, default=DEFAULT_MAX_DROP_DB,
              metavar="DB",
              help="an SNR drop against the baseline larger than this many dB is a "
                   "regression. Default: %(default)r")


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table. "
                                                       "Default: %(default)r")


def positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return value
    return parse


def add_token_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--img-tokens", type=positive_int("img-tokens"), default=256, metavar="N",
                   help="image tokens per sample. Default: %(default)r")
    p.add_argument("--txt-tokens", type=positive_int("txt-tokens"), default=256, metavar="N",
                   help="text tokens per sample. Default: %(default)r")


# ---- output helpers -----------------------------------------------------------------


def out(text: str) -> None:
    """Write to stdout; a terminal that cannot show a character still gets UTF-8 bytes."""
    try:
        sys.stdout.write(text)
    except UnicodeEncodeError:
        sys.stdout.flush()
        sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.flush()


def progress(command: str, message: str, quiet: bool = False) -> None:
    if not quiet:
        print(f"{PROG} {command}: {message}", file=sys.stderr, flush=True)


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


# ---- files ----------------------------------------------------------------------------


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CommandError(f"{path}: cannot read {what}: {getattr(e, 'strerror', None) or e}") \
            from None


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise CommandError(f"{path}: cannot write: {e.strerror or e}") from None


def load_report(path: Path) -> Report:
    try:
        return Report.load(path)
    except ReportError as e:  # names the file and the problem
        raise CommandError(str(e)) from None

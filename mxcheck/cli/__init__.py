"""The ``mxcheck`` command: info, formats, report, compare, divergence, and the deployment
checks lint, tuned-coverage and aiter-log.

Each subcommand is one entry of ``COMMANDS`` (``mxcheck.cli.main``): a help line, a function
that adds its arguments, and a function that runs it and returns the exit code. Adding a
subcommand is those two small functions, in the module of its group, and one line in the
table. The groups: ``about`` (info, formats), ``reports`` (report, compare), ``analysis``
(divergence, stats, thresholds), ``deploy`` (lint, tuned-coverage, aiter-log) and ``flux``
(shapes, sweep); ``common`` holds what they share.

Exit codes: 0 success, 1 a regression (``compare``) or a failed deployment check (an error
finding, a missing tuned shape, a logged miss), 2 bad usage or a bad input file.
Every error is one line on stderr (``mxcheck <command>: error: ...``), never a traceback; an
unexpected exception too is exit 2 with one line naming the command's files (``main``).
"""

from __future__ import annotations

from mxcheck.cli.about import collect_info, exact_text, format_row
from mxcheck.cli.common import CommandError, add_max_drop_option, parse_max_drop_db
from mxcheck.cli.main import COMMANDS, Command, build_parser, main

__all__ = [
    "COMMANDS",
    "Command",
    "CommandError",
    "add_max_drop_option",
    "build_parser",
    "collect_info",
    "exact_text",
    "format_row",
    "main",
    "parse_max_drop_db",
]

"""``mxcheck accuracy``: the cause-accuracy benchmark (``mxcheck.conformance.accuracy``).

Runs every labelled case (a backend with one bug and its true cause) as conformance does,
and prints precision (no failure headed by a wrong cause) and recall (the true cause named)
per class, with every miss. ``--write FILE`` keeps the record docs/cause-accuracy.md
renders. Exit 1 when any failure is headed by a wrong cause.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mxcheck.cli.common import CommandError, add_json_flag, out, to_json
from mxcheck.text import table

__all__ = ["accuracy_args", "run_accuracy"]


def accuracy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--case", action="append", default=[], metavar="NAME",
                   help="run only this case (repeatable; none: every case). Default: %(default)r")
    p.add_argument("--quick", action="store_true",
                   help="feed each quantize case only the input families that show its bug. Default: %(default)r")
    p.add_argument("--write", type=Path, metavar="FILE.json",
                   help="write the run's record (references/accuracy/cause_accuracy.json is the docs' one)")
    add_json_flag(p)


def run_accuracy(args: argparse.Namespace) -> int:
    from mxcheck.conformance import accuracy  # noqa: PLC0415  (imports the backends and runs them)

    known = {c.name: c for c in accuracy.CASES}
    unknown = [n for n in args.case if n not in known]
    if unknown:
        raise CommandError(f"--case {unknown[0]!r} is not a labelled case; known: {', '.join(known)}")
    cases = [known[n] for n in args.case] if args.case else list(accuracy.CASES)

    done: list[accuracy.Outcome] = []

    def progress(o: accuracy.Outcome) -> None:
        verdict = "named" if o.named else ("WRONG" if o.wrong else "missed")
        print(f"{o.case}: {verdict} ({', '.join(o.headline) or 'no headline'}; {o.cpu_seconds:g} CPU s)",
              file=sys.stderr)
        done.append(o)
        if args.write is not None:  # after each case: a long run stopped halfway keeps what it measured
            args.write.parent.mkdir(parents=True, exist_ok=True)
            args.write.write_text(json.dumps(accuracy.record(done, quick=args.quick), indent=1) + "\n")

    outcomes = accuracy.run_cases(cases, quick=args.quick, progress=progress)
    data = accuracy.record(outcomes, quick=args.quick)
    if args.json:
        out(to_json(data))
    else:
        out(table(accuracy.scores_table(outcomes), indent="") + f"\n{len(outcomes)} cases in {data['seconds']} s\n")
    return 1 if any(o.wrong for o in outcomes) else 0

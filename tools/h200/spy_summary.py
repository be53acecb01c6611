"""Self and inclusive shares of the functions in py-spy's raw (collapsed) output.

    python3 tools/h200/spy_summary.py spy.txt [--top 40] [--within main backward]

``--within`` keeps the samples whose stack holds a frame with one of these texts (the loop's
work and the autograd thread's, not the imports); both shares are of those samples.
"""

from __future__ import annotations

import argparse
import collections


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--within", nargs="*", default=[])
    args = p.parse_args()
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    with open(args.raw) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            if args.within and not any(w in fr for fr in frames for w in args.within):
                continue
            n = int(count)
            total += n
            threads[frames[0]] += n
            own[frames[-1]] += n
            for fr in set(frames[1:]):
                inclusive[fr] += n
    print(f"{total} samples; by thread: " + ", ".join(f"{t} {c / total:.1%}" for t, c in threads.most_common()))
    for title, counter in (("self", own), ("inclusive", inclusive)):
        print(f"\n== {title}")
        for name, c in counter.most_common(args.top):
            print(f"{c / total:6.1%}  {name[:150]}")


if __name__ == "__main__":
    main()

"""Examples per second of each `mxcheck search` property on the oracle itself (CPU).

    PYTHONPATH=$PWD python benchmarks/bench_search.py mxfp4 nvfp4 fp8 mxfp8

Each property runs alone for 200 examples; the rate is given per second of this process's
CPU time (the search runs torch on one thread) and per second of wall time.
"""

from __future__ import annotations

import sys
import time

from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance.search import PROPERTIES, search

EXAMPLES = 200


def main(recipes: list[str]) -> None:
    for recipe in recipes:
        row = []
        for prop in PROPERTIES:
            cpu, wall = time.process_time(), time.monotonic()
            result = search(EmulatedBackend, recipe, seconds=600, properties=[prop], max_examples=EXAMPLES)
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            n = result.examples.get(prop, 0)
            row.append(f"{prop} {n / cpu:.0f}/cpu-s ({n / wall:.0f}/wall-s)")
        print(f"{recipe}: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["mxfp4"])

"""Whether two mxcheck report JSONs hold the same records (every field but the environment):
a speed change must not move one bit of a sweep's SNRs. Prints the count and the first
differences; exit 1 where they differ.

    python3 tools/h200/same_records.py references/baselines/h200/bench/sweep_12b_final.json OUT/sweep.json
"""

import json
import sys


def records(path: str) -> list[dict]:
    with open(path) as f:
        return json.load(f)["records"]


def main() -> int:
    want, got = records(sys.argv[1]), records(sys.argv[2])
    if len(want) != len(got):
        print(f"{len(got)} records against {len(want)}")
        return 1
    differ = [(i, k) for i, (a, b) in enumerate(zip(want, got, strict=True)) for k in a if a[k] != b.get(k)]
    print(f"{len(want)} records, {len(differ)} fields differ" + "".join(
        f"\n  record {i} ({want[i]['recipe']} {want[i]['direction']} {want[i]['layer']}) {k}: {want[i][k]!r} -> "
        f"{got[i].get(k)!r}" for i, k in differ[:8]))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

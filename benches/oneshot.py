#!/usr/bin/env python3
"""`ongrid-executor run` (one-shot) wall and CPU time, several builds side by side.

    benches/oneshot.py MANIFEST CONFIG EXECUTOR... [--rounds N]

Runs `/bin/cat /dev/null` and `EXECUTOR run --manifest MANIFEST --config CONFIG
--args '{"a":1}'` for each EXECUTOR, in a rotating order, with 50 ms idle
before and 30 ms after each command (one-shot runs are not back to back in
practice: the first cgroup join after an idle gap waits an RCU grace period). Prints wall p50/p90
and CPU p50 (the process and its reaped children). Run as root, under
`chrt -f 10` on a shared machine.
"""
import resource
import statistics
import subprocess
import sys
import time


def main():
    args = sys.argv[1:]
    rounds = 80
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i : i + 2]
    if len(args) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    manifest, config, executors = args[0], args[1], args[2:]
    cases = {"cat": ["/bin/cat", "/dev/null"]}
    for x in executors:
        cases[x] = [x, "run", "--manifest", manifest, "--config", config, "--args", '{"a":1}']
    wall = {k: [] for k in cases}
    cpu = {k: [] for k in cases}
    names = list(cases)
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            time.sleep(0.05)
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(cases[k], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            wall[k].append((time.perf_counter() - t0) * 1e3)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[k].append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e3)
            time.sleep(0.03)
    for k in names:
        w = sorted(wall[k])
        print(f"{k}: wall p50 {statistics.median(w):.2f} ms p90 {w[int(len(w) * 0.9)]:.2f} ms"
              f" cpu p50 {statistics.median(cpu[k]):.2f} ms")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where a profile's samples went, by thread name and by the system call,
fault or interrupt each sample was in (BENCHMARKS.md, "Profile").

usage: perf script -i perf.data | perf_by_call.py [--comm NAME] [--top N]

Reads `perf script` output of a call-graph recording (`perf record -g`,
best with a frame-pointer build). With no `--comm`, prints each thread
name's share of all samples; with `--comm NAME`, that name's samples
grouped by the outermost kernel entry in each stack:

  sys:FN          the system call's handler just below `do_syscall_64`
  pagefault       an exception entry for a page fault
  irq:FN          an interrupt or IPI entry
  user:FN         no kernel entry: the innermost user-space function

Shares are of the samples printed; with `cpu-clock` sampling at F Hz on
C busy CPUs, one sample is 1/F s of CPU.
"""

import argparse
import collections
import re
import sys

FRAME = re.compile(r"^\s*[0-9a-f]+\s+(\S+?)(?:\+0x[0-9a-f]+)?\s")


def samples(text):
    """Yields (comm, [frames innermost first]) for each sample."""
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line.strip()]
        if not lines:
            continue
        comm = lines[0].split()[0]
        frames = []
        for line in lines[1:]:
            m = FRAME.match(line + " ")
            if m:
                frames.append(m.group(1))
        yield comm, frames


def entry(frames):
    """The outermost kernel entry of one stack, as the module docs say."""
    for i, f in enumerate(frames):
        if f == "do_syscall_64":
            return "sys:" + (frames[i - 1] if i > 0 else "(do_syscall_64 itself)")
        if f.startswith("asm_exc_page_fault"):
            return "pagefault"
        if f.startswith("asm_sysvec") or f.startswith("asm_common_interrupt"):
            return "irq:" + f
    return "user:" + (frames[0] if frames else "?")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--comm", help="group this thread name's samples by entry")
    ap.add_argument("--top", type=int, default=30, help="lines to print (30)")
    args = ap.parse_args()
    counts = collections.Counter()
    for comm, frames in samples(sys.stdin.read()):
        if args.comm is None:
            counts[comm] += 1
        elif comm == args.comm:
            counts[entry(frames)] += 1
    total = sum(counts.values())
    if total == 0:
        sys.exit("no samples" + (f" of {args.comm}" if args.comm else ""))
    for key, n in counts.most_common(args.top):
        print(f"{100 * n / total:6.2f} % {n:7d}  {key}")
    print(f"{100:6.2f} % {total:7d}  (all)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""System calls and switches per run, by process.

usage: syscalls.py OUT.txt -- LOADBENCH_COMMAND...     (as root)
       syscalls.py --parse OUT.txt

Records the `raw_syscalls/sys_enter`, `sched_switch` and
`sched_process_exec` events (tracefs, with each thread's process id) while
the command runs, then counts, per run (one run = one `exec` of a skill
named `run`, as loadbench's skills are; a warm run's is its refill's), the
system calls each process's threads entered and the times they were
switched out, with the calls each process made most. The daemons' start-up
and the warm-up runs fall in the counts too: run one variant with many
iterations, e.g.

    syscalls.py /tmp/sc.txt -- $BIN/loadbench --iters 300 --warmup 20 --conc 1 \\
        --warm 8 --skills bin-cat --variants daemon-warm --bin-dir $BIN

In a guest where entering the kernel and switching are dear, these counts
follow a daemon's CPU per run more closely than its instructions do, and
unlike the latency they are the same from one invocation to the next.
"""
import collections
import re
import sys

from tracefs import Trace, main

EVENTS = ('raw_syscalls/sys_enter', 'sched/sched_switch', 'sched/sched_process_exec')
UNISTD = '/usr/include/x86_64-linux-gnu/asm/unistd_64.h'
TOP = 12


def call_names():
    """System call numbers to names, from the kernel headers when installed."""
    try:
        with open(UNISTD) as f:
            return {int(n): name for name, n in re.findall(r'#define __NR_(\w+) (\d+)', f.read())}
    except OSError:
        return {}


def parse(path):
    trace, names = Trace(path), {}
    calls, switches = collections.Counter(), collections.Counter()
    by_call = collections.defaultdict(collections.Counter)
    runs = 0
    for _, tid, _, _, event, rest in trace.events():
        process = names.get(trace.process(tid))
        if event == 'sys_enter':
            if process:
                nr = int(re.match(r'NR (-?\d+)', rest).group(1))
                calls[process] += 1
                by_call[process][nr] += 1
        elif event == 'sched_switch':
            if process:
                switches[process] += 1
        elif event == 'sched_process_exec':
            fields = dict(re.findall(r'(\w+)=(\S+)', rest))
            pid = int(fields['pid'])
            names[pid] = fields['filename'].rsplit('/', 1)[-1]
            runs += names[pid] == 'run'
    if trace.lost:
        print('warning: the trace buffer overflowed; counts are low', file=sys.stderr)
    print(f'runs: {runs}')
    if not runs:
        return
    label = call_names()
    print(f'{"process":<18} {"calls/run":>10} {"switches/run":>12}  the most made, per run')
    for process, n in calls.most_common():
        if process == 'run' or n < runs:
            continue
        top = ' '.join(f'{label.get(nr, nr)}:{c / runs:.2f}'
                       for nr, c in by_call[process].most_common(TOP))
        print(f'{process:<18} {n / runs:>10.2f} {switches[process] / runs:>12.2f}  {top}')


if __name__ == '__main__':
    main(__doc__, EVENTS, 131072, parse)

#!/usr/bin/env python3
"""Thread wake-ups per run, and how many were for nothing.

usage: wakeups.py OUT.txt -- LOADBENCH_COMMAND...     (as root)
       wakeups.py --parse OUT.txt

Records the scheduler's `sched_waking`, `sched_switch` and
`sched_process_exec` events (tracefs, with each thread's process id) while
the command runs, then counts, per run (one run = one `exec` of a skill
named `run`, as loadbench's skills are), the wake-ups of each process's
threads (each sleep, interruptible or not, that a wake-up ended) by the
waker's process, and how many of them were spurious: the woken thread ran
under 40 us and went back to sleep without waking anyone. On the
benchmark host tracefs records no switch out of the idle task on one of
the two vCPUs; a run whose switch-in is missing is timed from its
wake-up instead, so a spurious one may be counted as real, never the
other way.
An `EPOLLOUT` edge nobody waits for, or a runtime worker unparked to find
no task, looks like that.
"""
import collections
import re
import sys

from tracefs import Trace, main

EVENTS = ('sched/sched_waking', 'sched/sched_switch', 'sched/sched_process_exec')
SPURIOUS_US = 40.0


def parse(path):
    trace, names = Trace(path), {}
    # Per woken thread: when it was woken, by which process, whether it has
    # woken anyone since, and when it was switched in (if that was seen).
    woken = {}
    wakeups, spurious = collections.Counter(), collections.Counter()
    runs = 0
    for _, tid, _, t, event, rest in trace.events():
        fields = dict(re.findall(r'(\w+)=(\S+)', rest))
        if event == 'sched_process_exec':
            pid = int(fields['pid'])
            names[pid] = fields['filename'].rsplit('/', 1)[-1]
            runs += names[pid] == 'run'
        elif event == 'sched_waking':
            if tid in woken:
                woken[tid]['woke'] = True
            target = int(fields['pid'])
            if target not in woken:
                waker = names.get(trace.process(tid), '?')
                woken[target] = {'at': t, 'by': waker, 'woke': False, 'in': None}
        elif event == 'sched_switch':
            prev, nxt = int(fields['prev_pid']), int(fields['next_pid'])
            if nxt in woken and woken[nxt]['in'] is None:
                woken[nxt]['in'] = t
            state = woken.get(prev)
            if state and fields['prev_state'][:1] in 'SD':
                # This host's tracefs drops the switches out of idle on
                # one vCPU: without the switch-in, the run is counted
                # from the wake-up (an upper bound of its length).
                start = state['in'] if state['in'] is not None else state['at']
                key = (names.get(trace.process(prev), '?'), state['by'])
                wakeups[key] += 1
                if not state['woke'] and t - start < SPURIOUS_US:
                    spurious[key] += 1
                del woken[prev]
    if trace.lost:
        print('warning: the trace buffer overflowed; counts are low', file=sys.stderr)
    print(f'runs: {runs}')
    print(f'{"woken (process)":<18} {"by":<18} {"wake-ups/run":>12} {"spurious/run":>12}')
    ours = ('ongrid-skilld', 'ongrid-executor', 'loadbench')
    for key, n in sorted(wakeups.items(), key=lambda kv: -kv[1]):
        if key[0] in ours and runs:
            print(f'{key[0]:<18} {key[1]:<18} {n / runs:>12.2f} {spurious[key] / runs:>12.2f}')
    for proc in ours:
        total = sum(n for k, n in wakeups.items() if k[0] == proc)
        spur = sum(n for k, n in spurious.items() if k[0] == proc)
        if runs and total:
            print(f'{proc}: {total / runs:.2f} wake-ups per run, {spur / runs:.2f} spurious')


if __name__ == '__main__':
    main(__doc__, EVENTS, 65536, parse)

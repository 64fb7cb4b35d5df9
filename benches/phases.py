#!/usr/bin/env python3
"""Where a skill's spawn and exit take their time, sandboxed against bare.

usage: phases.py OUT.txt -- LOADBENCH_COMMAND...     (as root)
       phases.py --parse OUT.txt

Records the scheduler's fork, exec, exit and switch events and every
system call's entry and exit (tracefs, with each thread's process id)
while the command runs, then splits each run of a skill named `run` (as
loadbench's skills are) into phases, from the kernel's own timestamps:

  clone       the parent's clone/clone3 entry -> the child exists; for a
              child made ahead of its run (parked in a spawner thread's
              berth, grouped as `... parked`): the run's futex wake-up
              of the berth -> the child returns from its futex wait
  child       the child exists (or returns from its wait) -> its execve
              entry (a bare spawn's glibc steps, or the sandbox's step 4)
  execve      execve entry -> the new image runs
  skill       the new image runs -> its exit_group entry
  exit        exit_group entry -> the process is a zombie
  reap        zombie -> the parent's wait4 returns it

and counts the child's system calls before its execve. Runs are grouped by
who created the child: `bare` (a thread of loadbench itself), or the name
of the creating thread (`ongrid-spawner` for the in-process engine) and,
when the process is not loadbench's, the process (`ongrid-spawner
(ongrid-executor)` for `executor-rpc`, `... via skilld` for `daemon`).

For a run loadbench asked another process for (sequential runs only),
the phases outside the spawn, from reads and writes of more than 8 bytes:

  request     loadbench sends its request -> the spawning process reads one
  prepare     that read -> the clone entry
  report      reaped -> the spawning process writes its answer
  answer      that write -> loadbench reads an answer
  outside     their sum

and through skilld the request and the answer split at skilld's first
read and next write: the hop to skilld, skilld's work, the hop on.
Tracing each system call costs about a microsecond, so compare the groups
with each other, not with untraced latencies.
"""
import bisect
import collections
import re
import statistics
import sys

from tracefs import Trace, main

EVENTS = ('sched/sched_process_fork', 'sched/sched_process_exec', 'sched/sched_process_exit',
          'sched/sched_switch', 'raw_syscalls/sys_enter', 'raw_syscalls/sys_exit')
SYSCALL = re.compile(r'NR (-?\d+) (?:\((\w+)|= (-?\d+))')
CLONE, CLONE3, EXECVE, EXIT, EXIT_GROUP, WAIT4, WAITID, FUTEX = 56, 435, 59, 60, 231, 61, 247, 202
READS, WRITES = (0, 19, 45, 47), (1, 20, 44, 46)
PHASES = ('clone', 'child', 'execve', 'skill', 'exit', 'reap')
AROUND = ('request', 'prepare', 'report', 'answer')
RELAY = (' to skilld', ' in skilld', ' to executor', ' to skilld ', ' in skilld ', ' to client')


class Thread:
    """One thread's events, in time order: (us, kind, nr, value)."""

    def __init__(self):
        self.events = []

    def last_before(self, t, kind, nrs, value=None):
        found = None
        for e in self.events:
            if e[0] >= t:
                break
            if e[1] == kind and e[2] in nrs and (value is None or e[3] == value):
                found = e
        return found

    def first_after(self, t, kind, nrs, value=None):
        for e in self.events:
            if e[0] > t and e[1] == kind and e[2] in nrs and (value is None or e[3] == value):
                return e
        return None


def parse(path):
    threads = collections.defaultdict(Thread)
    trace, comm = Trace(path), {}
    forks, execs, zombies = {}, [], {}
    for name, tid, _, t, event, rest in trace.events():
        comm.setdefault(tid, name)
        if event in ('sys_enter', 'sys_exit'):
            s = SYSCALL.match(rest)
            if s:
                nr = int(s.group(1))
                value = int(s.group(2), 16) if s.group(2) else int(s.group(3))
                threads[tid].events.append((t, event, nr, value))
            continue
        fields = dict(re.findall(r'(\w+)=(\S+)', rest))
        if event == 'sched_process_fork':
            child = int(fields['child_pid'])
            forks[child] = (t, tid)
            comm[tid] = name
        elif event == 'sched_process_exec' and fields['filename'].endswith('/run'):
            execs.append((t, tid))
        elif event == 'sched_switch' and fields['prev_state'].startswith('Z'):
            zombies.setdefault(int(fields['prev_pid']), t)
    if trace.lost:
        print('warning: the trace buffer overflowed; some runs are missing', file=sys.stderr)
    groups = collections.defaultdict(lambda: collections.defaultdict(list))
    # loadbench itself (the loadbench process no loadbench thread forked:
    # an engine worker is one), skilld, and each process's reads and
    # writes, in time order.
    main_pid = next((p for p, n in comm.items() if n == 'loadbench' and trace.process(p) == p
                     and comm.get(forks.get(p, (0, 0))[1]) != 'loadbench'), None)
    skilld = next((p for p, n in comm.items() if n == 'ongrid-skilld' and trace.process(p) == p),
                  None)
    io = collections.defaultdict(list)
    for tid, th in threads.items():
        io[trace.process(tid)].extend(e for e in th.events
                                      if e[2] in READS + WRITES and e[1] == 'sys_exit')
    for events in io.values():
        events.sort()
    for done, pid in execs:
        if pid not in forks or pid not in zombies:
            continue
        forked, parent = forks[pid]
        child = threads[pid]
        clone = threads[parent].last_before(forked + 0.5, 'sys_enter', (CLONE, CLONE3))
        execve = child.last_before(done, 'sys_enter', (EXECVE,))
        # `exit` too: loadbench's static-cat has no C library and ends its only
        # thread with it.
        exit_group = child.first_after(done, 'sys_enter', (EXIT, EXIT_GROUP))
        zombie = zombies[pid]
        process = trace.process(parent)
        reaped = [th.first_after(zombie - 1, 'sys_exit', (WAIT4, WAITID), pid)
                  for tid, th in threads.items() if trace.process(tid) == process]
        reaped = min((r for r in reaped if r), default=None, key=lambda r: r[0])
        if not (clone and execve and exit_group and reaped):
            continue
        # A child made ahead: it waited on a futex after it was forked; the
        # run starts it with a FUTEX_WAKE on the same word from a thread of
        # the spawning process. Its phases start at that wake-up.
        # The berth's word is the first the child waits on; a later wait on
        # another word (for the cgroup joins its run makes) is part of the
        # child's phase.
        parked = False
        first_wait = child.first_after(forked, 'sys_enter', (FUTEX,))
        waited = first_wait and child.last_before(execve[0], 'sys_enter', (FUTEX,),
                                                  first_wait[3])
        woke = waited and child.first_after(waited[0], 'sys_exit', (FUTEX,))
        if waited and woke and waited[0] > forked and woke[0] < execve[0]:
            wakes = [th.last_before(woke[0], 'sys_enter', (FUTEX,), waited[3])
                     for tid, th in threads.items()
                     if trace.process(tid) == process and tid != pid]
            wake = max((w for w in wakes if w), default=None, key=lambda w: w[0])
            # No wake-up after it began to wait: the run came first (the
            # child never slept on it), timed from the fork as before.
            if wake and wake[0] >= waited[0]:
                parked = True
                clone, forked = wake, woke[0]
        # The creating thread, and its process when that is not loadbench's
        # own (the engine worker is a loadbench process too).
        who = comm.get(parent, '?')
        owner = comm.get(process, '?')
        if who == 'loadbench':
            who = 'bare'
        elif owner != 'loadbench':
            who = f'{who} ({owner})'
        if parked:
            who += ' parked'
        outside = {}
        if process != main_pid:
            outside = around(io[main_pid], io[process], clone[0], reaped[0])
            # Asked through skilld: skilld read between the two.
            if outside and skilld and first_io(io[skilld], outside['sent'], READS, outside['read']):
                who += ' via skilld'
                outside.update(relayed(io[skilld], outside))
        g = groups[who]
        for phase in AROUND + ('outside',) + RELAY:
            if phase in outside:
                g[phase].append(outside[phase])
        g['clone'].append(forked - clone[0])
        g['child'].append(execve[0] - forked)
        g['execve'].append(done - execve[0])
        g['skill'].append(exit_group[0] - done)
        g['exit'].append(zombie - exit_group[0])
        g['reap'].append(reaped[0] - zombie)
        g['total'].append(reaped[0] - clone[0])
        g['child syscalls'].append(sum(1 for e in child.events
                                       if forked <= e[0] < execve[0] and e[1] == 'sys_enter'))
    names = sorted(groups, key=lambda k: (k != 'bare', k))
    width = [max(10, len(n) + 2) for n in names]
    print(f'{"p50 (us)":<16}' + ''.join(f'{n:>{w}}' for n, w in zip(names, width)))
    for phase in PHASES + ('total', 'child syscalls') + AROUND + ('outside',) + RELAY:
        row = [statistics.median(groups[n][phase]) if groups[n][phase] else None for n in names]
        print(f'{phase:<16}' + ''.join(f'{"-":>{w}}' if v is None else f'{v:>{w}.1f}'
                                       for v, w in zip(row, width)))
    print(f'{"runs":<16}' + ''.join(f'{len(groups[n]["total"]):>{w}}' for n, w in zip(names, width)))


def around(client, server, clone, reaped):
    """The phases outside the spawn of a run loadbench asked another
    process for (sequential runs only): loadbench sends its request, the
    spawning process reads one (`request`), `clone`s (`prepare`) ... the
    child is reaped, the process writes an answer (`report`), loadbench
    reads one (`answer`); `outside` is their sum. A read or write of 8
    bytes or fewer (an eventfd's wake-up) is neither."""
    sent = last_io(client, clone, WRITES)
    read = sent and first_io(server, sent, READS, clone)
    wrote = read and first_io(server, reaped, WRITES)
    got = wrote and first_io(client, wrote, READS)
    if not got:
        return {}
    return {'sent': sent, 'read': read, 'wrote': wrote, 'got': got, 'request': read - sent, 'prepare': clone - read,
            'report': wrote - reaped, 'answer': got - wrote,
            'outside': clone - sent + got - reaped}


def relayed(relay, o):
    """`request` and `answer` through skilld, split at skilld's first read
    and its next write: the request's hop to skilld, skilld's work, the
    hop to the executor; the answer's the same way back."""
    split = {}
    read = first_io(relay, o['sent'], READS, o['read'])
    wrote = read and first_io(relay, read, WRITES, o['read'])
    if wrote:
        split.update({' to skilld': read - o['sent'], ' in skilld': wrote - read,
                      ' to executor': o['read'] - wrote})
    back = first_io(relay, o['wrote'], READS, o['got'])
    out = back and first_io(relay, back, WRITES, o['got'])
    if out:
        split.update({' to skilld ': back - o['wrote'], ' in skilld ': out - back,
                      ' to client': o['got'] - out})
    return split


def last_io(events, before, nrs):
    """The time of the last read or write (`nrs`) of more than 8 bytes that
    returned before `before`."""
    for t, _, nr, value in reversed(events[:bisect.bisect_left(events, (before,))]):
        if nr in nrs and value > 8:
            return t
    return None


def first_io(events, after, nrs, before=float('inf')):
    """The time of the first read or write (`nrs`) of more than 8 bytes that
    returned after `after` (and before `before`)."""
    for t, _, nr, value in events[bisect.bisect_right(events, (after,)):]:
        if t >= before:
            break
        if nr in nrs and value > 8:
            return t
    return None


if __name__ == '__main__':
    main(__doc__, EVENTS, 200000, parse)

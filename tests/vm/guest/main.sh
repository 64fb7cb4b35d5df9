#!/bin/bash
# Guest side of tests/vm/run: runs as root under systemd (PID 1) at boot,
# from the host's exchange disk (argument: its mount point), and does what an
# operator does with the package: apt install, enable, add the example
# packs with their grants, run them, break things, upgrade, purge.
#
# Every check appends `PASS name` or `FAIL name: reason` to
# out/results.txt (and `INFO name: ...` for recorded values); its
# diagnostics go to out/guest.log. The last line is `ongrid-vm: checks
# finished`: the host counts a run without it as failed.
# No -e or -u: a check that goes wrong fails itself, not the rest.
set -o pipefail

share=${1:?usage: main.sh SHARE}
here=$share/guest
out=$share/out
results=$out/results.txt
distro=$(cat "$share/distro")
work=/root/ongrid-vm
mkdir -p "$work"
: > "$results"

# shellcheck source=tests/vm/guest/lib.sh
. "$here/lib.sh"
# shellcheck source=tests/vm/guest/install.sh
. "$here/install.sh"
# shellcheck source=tests/vm/guest/runs.sh
. "$here/runs.sh"
# shellcheck source=tests/vm/guest/service.sh
. "$here/service.sh"
# shellcheck source=tests/vm/guest/lifecycle.sh
. "$here/lifecycle.sh"
# shellcheck source=tests/vm/guest/suite.sh
. "$here/suite.sh"
# shellcheck source=tests/vm/guest/rpm.sh
. "$here/rpm.sh"

log "== ongrid-vm guest: $distro, kernel $(uname -r), systemd $(systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p')"
# The checks start once the boot is done (this unit is Type=simple, so it
# does not hold the boot up).
timeout 300 systemctl is-system-running --wait >/dev/null 2>&1
info boot "system $(systemctl is-system-running 2>&1), $(systemd-analyze 2>/dev/null | head -n 1)"
info kernel "$(uname -r), $(systemctl --version | head -n 1), cgroup $(stat -fc %T /sys/fs/cgroup), landlock ABI $(landlock_abi)"

# Order matters: each group leaves the system as the next one needs it.
check host-cgroup-v2 check_host_cgroup_v2
check apt-install check_apt_install || { finish; exit 0; }
check sysusers check_sysusers
check tmpfiles check_tmpfiles
check units-enabled check_units_enabled
check sockets-active check_sockets_active
check socket-activation check_socket_activation
# Scored as packaged: before the network drop-in the probes' grants need.
check security-scores check_security_scores
check packs-installed check_packs_installed
check test-packs-installed install_test_packs
for skill in $EXAMPLES; do
    check "run-api-$skill" check_run_api "$skill"
    check "run-cli-$skill" check_run_cli "$skill"
done
check sandbox-cgroup-v2 check_sandbox_cgroup_v2
check sandbox-landlock-degraded check_landlock_degraded
check ungranted-network-rejected check_ungranted_network
check egress-refused check_egress_refused
check proc-own check_proc_own
check warm-idle check_warm_idle
check sandbox-suite-oneshot check_sandbox_suite oneshot
check sandbox-suite-served check_sandbox_suite serve
check fork-bomb-stopped check_fork_bomb
check memory-hog-stopped check_memory_hog
check disk-filler-stopped check_disk_filler
check kill-executor-mid-run check_kill_executor
check kill-skilld-mid-run check_kill_skilld
check stop-drains check_stop_drains
check journal-priorities check_journal_priorities
check no-failed-units check_no_failed_units
check upgrade-keeps-edits-and-audit check_upgrade
check purge check_purge
check rpm-install check_rpm_install
check rpm-erase check_rpm_erase
finish

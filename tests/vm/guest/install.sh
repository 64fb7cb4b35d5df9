# Guest checks: install as an operator does, and what the package sets up
# (sourced by main.sh).

check_host_cgroup_v2() {
    [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || why "/sys/fs/cgroup is not cgroup2"
    grep -qw memory /sys/fs/cgroup/cgroup.controllers &&
        grep -qw pids /sys/fs/cgroup/cgroup.controllers ||
        why "memory/pids controllers missing: $(cat /sys/fs/cgroup/cgroup.controllers)"
}

check_apt_install() {
    local deb
    deb=$(find "$share/pkg" -maxdepth 1 -name '*.deb' ! -name previous.deb | head -n 1)
    [ -n "$deb" ] || { why "no .deb on the exchange disk"; return 1; }
    cp "$deb" "$share/pkg/previous.deb" /root/
    CURRENT_DEB=/root/${deb##*/}
    # No network and no package lists: everything it depends on must
    # already be installed, as apt resolves it.
    DEBIAN_FRONTEND=noninteractive apt-get install -y "$CURRENT_DEB" \
        > "$work/apt-install.log" 2>&1
    local rc=$?
    cat "$work/apt-install.log"
    [ "$rc" = 0 ] || { why "apt-get install ./$(basename "$deb") exited $rc: $(tail -n 2 "$work/apt-install.log")"; return 1; }
    dpkg-query -W -f='${Status}' ongrid-skills | grep -q 'install ok installed' ||
        { why "dpkg: $(dpkg-query -W -f='${Status}' ongrid-skills)"; return 1; }
    info version "$(dpkg-query -W -f='${Version}' ongrid-skills)"
}

check_sysusers() {
    local u
    for u in ongrid ongrid-skill; do
        getent passwd "$u" >/dev/null || { why "user $u missing"; return 1; }
        [ "$(getent passwd "$u" | cut -d: -f7)" = /usr/sbin/nologin ] ||
            why "user $u has shell $(getent passwd "$u" | cut -d: -f7)"
    done
    getent group ongrid >/dev/null || why "group ongrid missing"
    [ "$(getent passwd ongrid | cut -d: -f6)" = /var/lib/ongrid ] ||
        why "ongrid's home is $(getent passwd ongrid | cut -d: -f6)"
    [ ! -s "$work/why" ]
}

check_tmpfiles() {
    local spec path want got pass
    # Twice: as installed, then after tmpfiles ran again, as at each boot,
    # upgrade or reinstall (a later run's chmod must not narrow the ACL's
    # mask: an effective entry shows as `user:ongrid:rwx #effective:r-x`).
    for pass in installed again; do
        for spec in "/run/ongrid 1771 root:ongrid" "/run/ongrid/runs 711 root:root" \
            "/var/lib/ongrid 700 ongrid:ongrid" "/etc/ongrid/skills 755 root:root"; do
            read -r path want <<<"$spec"
            got=$(stat -c '%a %U:%G' "$path" 2>&1)
            [ "$got" = "$want" ] || why "$pass: $path is $got, expected $want"
        done
        getfacl -cp /run/ongrid 2>/dev/null | grep -qx 'user:ongrid:rwx' ||
            why "$pass: /run/ongrid has no ACL entry user:ongrid:rwx: $(getfacl -cp /run/ongrid 2>&1 | paste -sd' ')"
        [ "$pass" = again ] && break
        # The tmpfiles.d entry is what recreates /run/ongrid at every boot.
        systemd-tmpfiles --create ongrid-skills.conf || why "systemd-tmpfiles --create ongrid-skills.conf failed"
    done
    [ ! -s "$work/why" ]
}

check_units_enabled() {
    local u state
    for u in ongrid-executor.socket ongrid-skilld.socket ongrid-executor.service ongrid-skilld.service; do
        state=$(systemctl is-enabled "$u" 2>&1)
        [ "$state" = enabled ] || why "$u is $state"
    done
    [ ! -s "$work/why" ]
}

check_sockets_active() {
    local u
    for u in ongrid-executor.socket ongrid-skilld.socket ongrid-executor.service ongrid-skilld.service; do
        [ "$(systemctl is-active "$u")" = active ] || why "$u is $(systemctl is-active "$u") after install"
    done
    stat -c '%n %a %U:%G' /run/ongrid/executor.sock /run/ongrid/skilld.sock
    [ "$(stat -c '%a %U:%G' /run/ongrid/executor.sock 2>&1)" = "660 root:ongrid" ] ||
        why "executor.sock is $(stat -c '%a %U:%G' /run/ongrid/executor.sock 2>&1)"
    [ "$(stat -c '%a %U:%G' /run/ongrid/skilld.sock 2>&1)" = "660 ongrid:ongrid" ] ||
        why "skilld.sock is $(stat -c '%a %U:%G' /run/ongrid/skilld.sock 2>&1)"
    [ ! -s "$work/why" ]
}

# Both services stopped, the sockets left listening: the first client
# connection starts skilld, whose first run starts the executor.
check_socket_activation() {
    systemctl stop ongrid-skilld.service ongrid-executor.service 2>&1
    [ "$(systemctl is-active ongrid-skilld.service)" != active ] || { why "skilld still active after stop"; return 1; }
    curl -sS --max-time 60 --unix-socket "$SKILLD_SOCK" http://localhost/v1/health > "$work/health.json" ||
        { why "no answer on $SKILLD_SOCK with the service stopped"; return 1; }
    cat "$work/health.json"; echo
    wait_active ongrid-skilld.service 30 || why "ongrid-skilld.service not started by its socket"
    systemctl start ongrid-executor.service
    wait_active ongrid-executor.service 30 || why "ongrid-executor.service did not start"
    [ ! -s "$work/why" ]
}

# The packs as the README says (copy, grant, reload), the network drop-in
# the grants of the probes need, and an API client user.
check_packs_installed() {
    cp -r /usr/share/ongrid/examples/skills/. /etc/ongrid/skills/
    cat >> /etc/ongrid/executor.toml <<'TOML'

# Added by the VM test: the example packs' grants. Loopback is refused
# unless named, so each probe's grant names the guest's loopback servers.
[skills.probe_tcp]
network = true
connect = ["127.0.0.1:18080"]
[skills.probe_http]
network = true
connect = ["127.0.0.1:18080"]
[skills.probe_dns]
network = true
connect = ["127.0.0.1:18053"]
[skills.tail_file]
fs_read = ["/var/log"]
TOML
    mkdir -p /etc/systemd/system/ongrid-executor.service.d
    printf '[Service]\nPrivateNetwork=no\nRestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\nCapabilityBoundingSet=CAP_BPF CAP_NET_ADMIN\nSystemCallFilter=bpf\n' \
        > /etc/systemd/system/ongrid-executor.service.d/network.conf
    systemctl daemon-reload
    systemctl restart ongrid-executor.service || { why "restart of the executor with the grants failed"; return 1; }
    ongrid-skill reload || { why "ongrid-skill reload failed"; return 1; }
    getent passwd ongrid-vm-client >/dev/null ||
        useradd --system --no-create-home --shell /usr/sbin/nologin ongrid-vm-client
    usermod -aG ongrid ongrid-vm-client
    install -d -m 0755 /var/log/ongrid-vm
    printf 'one\ntwo\nthree\n' > /var/log/ongrid-vm/app.log
    chmod 0644 /var/log/ongrid-vm/app.log
    ongrid-skill list | tee "$work/list.txt"
    local s
    for s in $EXAMPLES; do
        grep -qw "$s" "$work/list.txt" || why "$s not listed after reload"
    done
    [ ! -s "$work/why" ]
}

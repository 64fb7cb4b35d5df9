# Guest checks: upgrade from the previous release and purge (sourced by
# main.sh). They run last: purge takes the package away.

# Rows of every table of the audit database(s) under /var/lib/ongrid.
audit_rows() {
    python3 - <<'PY'
import glob, sqlite3
total = 0
for path in sorted(glob.glob("/var/lib/ongrid/**/*.db", recursive=True)):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    for (table,) in db.execute("select name from sqlite_master where type = 'table'"):
        total += db.execute(f'select count(*) from "{table}"').fetchone()[0]
print(total)
PY
}

apt_deb() { # apt-get install of a local .deb, no network, old conffiles kept
    DEBIAN_FRONTEND=noninteractive apt-get install -y --allow-downgrades \
        -o Dpkg::Options::=--force-confold "$@" < /dev/null > "$work/apt.log" 2>&1
    local rc=$?
    cat "$work/apt.log"
    return "$rc"
}

# Down to the "previous release" (this package with a lower version), then
# the upgrade to this one: /etc/ongrid edits and the audit trail stay, the
# units run again and serve.
check_upgrade() {
    printf '\n# edited by the VM test\nmax_connections = 128\n' >> /etc/ongrid/skilld.toml
    local skilld_sum executor_sum rows current previous
    skilld_sum=$(md5sum < /etc/ongrid/skilld.toml)
    executor_sum=$(md5sum < /etc/ongrid/executor.toml)
    current=$(dpkg-query -W -f='${Version}' ongrid-skills)
    api_run echo '{"message":"before the upgrade"}' "$work/pre-upgrade.json"
    rows=$(audit_rows)
    info audit "rows before the upgrade: $rows"
    [ "${rows:-0}" -gt 0 ] || { why "no audit rows under /var/lib/ongrid before the upgrade: $(ls -la /var/lib/ongrid)"; return 1; }
    apt_deb /root/previous.deb || { why "install of the previous release failed: $(tail -n 2 "$work/apt.log")"; return 1; }
    previous=$(dpkg-query -W -f='${Version}' ongrid-skills)
    [ "$previous" != "$current" ] || { why "the previous release has version $previous"; return 1; }
    api_run echo '{"message":"on the previous release"}' "$work/on-previous.json"
    apt_deb "$CURRENT_DEB" || { why "upgrade $previous -> $current failed: $(tail -n 2 "$work/apt.log")"; return 1; }
    info upgrade "$previous -> $(dpkg-query -W -f='${Version}' ongrid-skills)"
    [ "$(md5sum < /etc/ongrid/skilld.toml)" = "$skilld_sum" ] || why "the edited skilld.toml was replaced"
    [ "$(md5sum < /etc/ongrid/executor.toml)" = "$executor_sum" ] || why "the edited executor.toml was replaced"
    ls /etc/ongrid/*.dpkg-* 2>/dev/null && why "dpkg left $(ls /etc/ongrid/*.dpkg-* | paste -sd' ')"
    local u
    for u in ongrid-executor.socket ongrid-skilld.socket ongrid-skilld.service; do
        wait_active "$u" 30 || why "$u is $(systemctl is-active "$u") after the upgrade"
    done
    api_run echo '{"message":"after the upgrade"}' "$work/post-upgrade.json"
    [ "$(outcome "$work/post-upgrade.json")" = ok ] || why "run after the upgrade: $(head -c 300 "$work/post-upgrade.json")"
    local after
    after=$(audit_rows)
    info audit "rows after the upgrade: $after"
    [ "${after:-0}" -gt "$rows" ] || why "audit rows went from $rows to $after"
    [ ! -s "$work/why" ]
}

# apt purge: everything of the package goes but the users and (README) the
# operator's packs under /etc/ongrid/skills.
check_purge() {
    DEBIAN_FRONTEND=noninteractive apt-get purge -y ongrid-skills < /dev/null > "$work/purge.log" 2>&1 ||
        { cat "$work/purge.log"; why "apt-get purge failed: $(tail -n 2 "$work/purge.log")"; return 1; }
    cat "$work/purge.log"
    local p left=()
    for p in /etc/ongrid/executor.toml /etc/ongrid/skilld.toml /var/lib/ongrid /run/ongrid \
        /usr/share/ongrid /usr/share/doc/ongrid-skills /usr/bin/ongrid-executor /usr/bin/ongrid-skilld \
        /usr/bin/ongrid-skill /usr/lib/systemd/system/ongrid-executor.service \
        /usr/lib/systemd/system/ongrid-skilld.service /usr/lib/systemd/system/ongrid-executor.socket \
        /usr/lib/systemd/system/ongrid-skilld.socket /usr/lib/sysusers.d/ongrid-skills.conf \
        /usr/lib/tmpfiles.d/ongrid-skills.conf \
        /etc/systemd/system/multi-user.target.wants/ongrid-executor.service \
        /etc/systemd/system/multi-user.target.wants/ongrid-skilld.service \
        /etc/systemd/system/sockets.target.wants/ongrid-executor.socket \
        /etc/systemd/system/sockets.target.wants/ongrid-skilld.socket; do
        if [ -e "$p" ] || [ -L "$p" ]; then left+=("$p"); fi
    done
    ((${#left[@]} == 0)) || why "left after purge: ${left[*]}"
    [ -d /etc/ongrid/skills/echo ] || why "purge removed the operator's packs in /etc/ongrid/skills"
    getent passwd ongrid >/dev/null && getent passwd ongrid-skill >/dev/null || why "purge removed a system user"
    local units
    units=$(systemctl list-units --all --no-legend --plain 'ongrid-*' | grep -v '^ongrid-vm' | awk '{ print $1 " " $3 }' | paste -sd' ')
    [ -z "$units" ] || why "units still loaded after purge: $units"
    pgrep -u ongrid,ongrid-skill -a && why "processes of ongrid/ongrid-skill left after purge"
    info purge "kept: $(find /etc/ongrid -maxdepth 2 | paste -sd' ') and the operator's drop-in /etc/systemd/system/ongrid-executor.service.d"
    [ ! -s "$work/why" ]
}

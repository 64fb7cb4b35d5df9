# Guest checks: the .rpm's scriptlets under the guest's systemd (sourced by
# main.sh, after the .deb is purged).
#
# Debian's rpm keeps a database of its own, apart from dpkg's, and no
# rpm package provides the `systemd` the .rpm requires: it is installed
# with --nodeps into the guest's root. What this cannot try: dependency
# resolution by dnf/zypper, the distribution's systemd RPM macros
# (the scriptlets carry their expansion), SELinux contexts, and rpm's own
# sysusers handling (rpm >= 4.19; Debian 12's rpm is 4.18).

RPM_UNITS="ongrid-executor.socket ongrid-skilld.socket ongrid-executor.service ongrid-skilld.service"

check_rpm_install() {
    local rpm
    rpm=$(find "$share/pkg" -maxdepth 1 -name '*.rpm' | head -n 1)
    [ -n "$rpm" ] || { why "no .rpm on the exchange disk"; return 1; }
    command -v rpm >/dev/null || { why "rpm is not in the image"; return 1; }
    cp "$rpm" /root/
    rpm -i --nodeps "/root/${rpm##*/}" > "$work/rpm-install.log" 2>&1 ||
        { cat "$work/rpm-install.log"; why "rpm -i exited non-zero: $(tail -n 2 "$work/rpm-install.log")"; return 1; }
    cat "$work/rpm-install.log"
    info rpm "$(rpm -q ongrid-skills), rpm $(rpm --version | awk '{ print $3 }')"
    # %pre and %post: the accounts, the runtime and state directories.
    getent passwd ongrid >/dev/null && getent passwd ongrid-skill >/dev/null || why "%pre made no accounts"
    [ "$(stat -c '%a %U:%G' /run/ongrid 2>&1)" = "1771 root:ongrid" ] ||
        why "/run/ongrid is $(stat -c '%a %U:%G' /run/ongrid 2>&1) after %post"
    [ -d /etc/ongrid/skills ] || why "%post made no /etc/ongrid/skills"
    # %post presets the units: what Debian's preset policy made of them.
    local u states=()
    for u in $RPM_UNITS; do states+=("$u=$(systemctl is-enabled "$u" 2>&1)"); done
    info rpm-preset "${states[*]}"
    systemctl enable --now ongrid-executor.socket ongrid-skilld.socket ||
        { why "enable --now of the sockets failed"; return 1; }
    wait_active ongrid-skilld.socket 30 || why "ongrid-skilld.socket is $(systemctl is-active ongrid-skilld.socket)"
    [ -d /etc/ongrid/skills/echo ] || cp -r /usr/share/ongrid/examples/skills/echo /etc/ongrid/skills/
    api_run echo '{"message":"from the rpm"}' "$work/rpm-echo.json"
    cat "$work/rpm-echo.json"; echo
    json "$work/rpm-echo.json" 'r["result"] == {"message": "from the rpm"}' >/dev/null ||
        why "echo through the rpm's units: $(head -c 300 "$work/rpm-echo.json")"
    [ ! -s "$work/why" ]
}

check_rpm_erase() {
    rpm -q ongrid-skills >/dev/null 2>&1 || { why "the rpm is not installed"; return 1; }
    rpm -e ongrid-skills > "$work/rpm-erase.log" 2>&1 ||
        { cat "$work/rpm-erase.log"; why "rpm -e exited non-zero: $(tail -n 2 "$work/rpm-erase.log")"; return 1; }
    local u
    # %preun stopped and disabled the units; %postun removed /run/ongrid.
    for u in $RPM_UNITS; do
        [ "$(systemctl is-active "$u")" != active ] || why "$u still active after rpm -e"
    done
    local p
    for p in /usr/bin/ongrid-executor /usr/bin/ongrid-skilld /usr/lib/systemd/system/ongrid-executor.service \
        /run/ongrid /usr/share/ongrid; do
        [ ! -e "$p" ] || why "$p left after rpm -e"
    done
    [ -d /etc/ongrid/skills/echo ] || why "rpm -e removed the operator's packs"
    pgrep -u ongrid,ongrid-skill -a && why "processes of ongrid/ongrid-skill left after rpm -e"
    [ ! -s "$work/why" ]
}

# %post of ongrid-skills: accounts and directories, then %systemd_post.
systemd-sysusers /usr/lib/sysusers.d/ongrid-skills.conf >/dev/null 2>&1 || :
systemd-tmpfiles --create /usr/lib/tmpfiles.d/ongrid-skills.conf >/dev/null 2>&1 || :
# The allow-list root for operator packs, shipped empty.
[ -d /etc/ongrid/skills ] || install -d -m 0755 -o root -g root /etc/ongrid/skills
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 1 ]; then
    # Enabled only where a preset says so (Fedora/RHEL default: disabled);
    # otherwise: systemctl enable --now ongrid-executor.socket ongrid-skilld.socket ongrid-executor ongrid-skilld
    systemctl --no-reload preset ongrid-executor.socket ongrid-skilld.socket ongrid-executor.service ongrid-skilld.service >/dev/null 2>&1 || :
fi
exit 0

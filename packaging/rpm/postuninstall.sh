# %postun of ongrid-skills (%systemd_postun_with_restart).
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -ge 1 ]; then
    systemctl try-restart ongrid-executor.service ongrid-skilld.service >/dev/null 2>&1 || :
else
    # A one-shot `ongrid-executor run` started by hand leaves its runs
    # tmpfs mounted under /run/ongrid in the host's mount namespace.
    awk '$2 ~ "^/run/ongrid/" { print $2 }' /proc/self/mounts | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null || :; done
    rm -rf /run/ongrid
    # Directories the payload cannot own (cargo-generate-rpm ships no
    # directory entries), deepest first; operator packs are kept. Every
    # directory of the payload must be here: .ci/package checks it.
    for d in /usr/share/ongrid/examples/skills/disk_usage \
        /usr/share/ongrid/examples/skills/echo \
        /usr/share/ongrid/examples/skills/host_load \
        /usr/share/ongrid/examples/skills/probe_dns \
        /usr/share/ongrid/examples/skills/probe_http \
        /usr/share/ongrid/examples/skills/probe_tcp \
        /usr/share/ongrid/examples/skills/tail_file \
        /usr/share/ongrid/examples/skills /usr/share/ongrid/examples \
        /usr/share/ongrid/monitoring /usr/share/ongrid \
        /usr/share/doc/ongrid-skills /etc/ongrid/skills /etc/ongrid; do
        rmdir "$d" 2>/dev/null || :
    done
fi
exit 0

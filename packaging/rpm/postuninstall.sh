# %postun of ongrid-skills (%systemd_postun_with_restart).
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -ge 1 ]; then
    systemctl try-restart ongrid-executor.service ongrid-skilld.service >/dev/null 2>&1 || :
else
    rm -rf /run/ongrid
fi
exit 0

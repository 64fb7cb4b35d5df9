# %preun of ongrid-skills (%systemd_preun): stop and disable on erase only.
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now ongrid-skilld.service ongrid-skilld.socket ongrid-executor.service ongrid-executor.socket >/dev/null 2>&1 || :
fi
exit 0

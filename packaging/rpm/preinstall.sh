# %pre of ongrid-skills. rpm >= 4.19 creates the accounts from the payload's
# sysusers.d file; older rpm (EL8/EL9) needs them created here.
getent group ongrid >/dev/null || groupadd -r ongrid
getent passwd ongrid >/dev/null || \
    useradd -r -g ongrid -d /var/lib/ongrid -s /sbin/nologin -c "ongrid-skills registry daemon" ongrid
getent group ongrid-skill >/dev/null || groupadd -r ongrid-skill
getent passwd ongrid-skill >/dev/null || \
    useradd -r -g ongrid-skill -d / -s /sbin/nologin -c "ongrid-skills sandboxed skills" ongrid-skill
exit 0

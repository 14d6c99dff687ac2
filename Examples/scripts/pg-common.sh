# Sourced by pg-up.sh, pg-down.sh and pg-pause.sh.

# as_pg COMMAND...: runs it as the postgres user when we are root (initdb and
# the server refuse to run as root), as ourselves otherwise.
as_pg() {
    if [[ $(id -u) -eq 0 ]]; then
        if command -v runuser >/dev/null; then
            (cd / && runuser -u postgres -- "$@")
        else
            (cd / && su postgres -s /bin/sh -c "$(printf '%q ' "$@")")
        fi
    else
        (cd / && "$@")
    fi
}

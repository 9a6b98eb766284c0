# Shared helpers for slurm/cluster.sh and slurm/sshd.sh. Source it; it does nothing by itself.
# shellcheck shell=bash

ORCH_SLURM_DIR="${ORCH_SLURM_DIR:-/tmp/orch-slurm}"
# The state dir lands in daemon configs unquoted and is removed with rm -rf: keep it plain and absolute.
if [[ ! "${ORCH_SLURM_DIR}" =~ ^/[A-Za-z0-9._/-]*[A-Za-z0-9._-]$ || "${ORCH_SLURM_DIR}" =~ (^|/)\.\.?(/|$) ]]; then
    printf 'orch-slurm: error: ORCH_SLURM_DIR must be an absolute path of [A-Za-z0-9._-] parts, got %s\n' \
        "${ORCH_SLURM_DIR}" >&2
    exit 2
fi
# shellcheck disable=SC2034 # used by the scripts that source this file
ORCH_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Fake hosts orch-n1..orch-nK live on 127.0.0.11..; the /etc/hosts block always names at least this many.
ORCH_MIN_HOSTS=8
ORCH_HOSTS_BEGIN="# BEGIN orch-slurm hosts (managed by orch slurm/*.sh; safe to delete)"
ORCH_HOSTS_END="# END orch-slurm hosts"

say() { printf '%s: %s\n' "${ORCH_PROG:-orch-slurm}" "$*" >&2; }
die() { say "error: $*"; exit 1; }
usage_error() { say "error: $*"; exit 2; }

# shell_quote VALUE: VALUE in single quotes, safe to source from bash and to read with Python's shlex.
shell_quote() {
    local q="'\\''"
    printf "'%s'" "${1//\'/${q}}"
}

require_root() {
    [[ "$(id -u)" -eq 0 ]] || die "run as root (it installs packages, edits /etc/hosts and starts daemons)"
}

# host_addr I -> loopback address of fake host I (1-based).
host_addr() { printf '127.0.0.%d\n' "$((10 + $1))"; }
host_name() { printf 'orch-n%d\n' "$1"; }

# install_packages CMD:PACKAGE...: apt-get installs each PACKAGE whose CMD is not on PATH (or not a file).
# Services are kept from auto-starting during the install (policy-rc.d), so only our own daemons run.
install_packages() {
    local pair cmd pkg missing=()
    for pair in "$@"; do
        cmd="${pair%%:*}"
        pkg="${pair#*:}"
        if ! command -v "${cmd}" >/dev/null 2>&1 && [[ ! -x "${cmd}" ]]; then
            missing+=("${pkg}")
        fi
    done
    [[ "${#missing[@]}" -eq 0 ]] && return 0
    say "installing ${missing[*]} (apt-get)"
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e "${policy}" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"${policy}"
        chmod 0755 "${policy}"
        made_policy=1
    fi
    local rc=0
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
        >"${ORCH_SLURM_DIR}/apt.log" 2>&1; then
        apt-get update -q >>"${ORCH_SLURM_DIR}/apt.log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
            >>"${ORCH_SLURM_DIR}/apt.log" 2>&1 || rc=$?
    fi
    [[ "${made_policy}" -eq 1 ]] && rm -f "${policy}"
    if [[ "${rc}" -ne 0 ]]; then
        tail -n 20 "${ORCH_SLURM_DIR}/apt.log" >&2
        die "apt-get install ${missing[*]} failed (log: ${ORCH_SLURM_DIR}/apt.log)"
    fi
}

# render_template SRC DEST KEY=VALUE...: copy SRC to DEST replacing every @KEY@ with VALUE (literally).
render_template() {
    local src="$1" dest="$2" text pair key value
    shift 2
    text="$(<"${src}")"
    for pair in "$@"; do
        key="${pair%%=*}"
        value="${pair#*=}"
        text="${text//"@${key}@"/"${value}"}"
    done
    if [[ "${text}" =~ @[A-Z_]+@ ]]; then
        die "template ${src}: placeholder ${BASH_REMATCH[0]} has no value"
    fi
    printf '%s\n' "${text}" >"${dest}.tmp"
    mv -f "${dest}.tmp" "${dest}"
}

# replace_block FILE BEGIN END [CONTENT] [top]: put CONTENT between marker lines BEGIN/END in FILE,
# replacing an earlier block; with empty CONTENT the block is removed. "top" puts a new block first.
# FILE is rewritten in place (not renamed), since /etc/hosts may be a bind mount.
replace_block() {
    local file="$1" begin="$2" end="$3" content="${4:-}" where="${5:-bottom}" rest
    [[ -e "${file}" ]] || : >"${file}"
    rest="$(awk -v b="${begin}" -v e="${end}" '$0 == b {skip = 1; next} $0 == e {skip = 0; next} !skip' "${file}")"
    {
        if [[ -n "${content}" && "${where}" == top ]]; then
            printf '%s\n%s\n%s\n' "${begin}" "${content}" "${end}"
        fi
        [[ -n "${rest}" ]] && printf '%s\n' "${rest}"
        if [[ -n "${content}" && "${where}" != top ]]; then
            printf '%s\n%s\n%s\n' "${begin}" "${content}" "${end}"
        fi
    } >"${file}.orch-tmp"
    cat "${file}.orch-tmp" >"${file}"
    rm -f "${file}.orch-tmp"
}

# ensure_hosts_block N: /etc/hosts names orch-n1..orch-nK (K >= N, K >= ORCH_MIN_HOSTS, never shrinks).
ensure_hosts_block() {
    local want="$1" have i lines=""
    have="$(hosts_block_count)"
    ((want < ORCH_MIN_HOSTS)) && want="${ORCH_MIN_HOSTS}"
    ((want < have)) && want="${have}"
    ((want > 200)) && die "at most 200 fake hosts (127.0.0.11-127.0.0.210)"
    if ((want == have)); then return 0; fi
    for ((i = 1; i <= want; i++)); do
        lines+="$(host_addr "${i}") $(host_name "${i}")"$'\n'
    done
    replace_block /etc/hosts "${ORCH_HOSTS_BEGIN}" "${ORCH_HOSTS_END}" "${lines%$'\n'}"
}

hosts_block_count() {
    awk -v b="${ORCH_HOSTS_BEGIN}" -v e="${ORCH_HOSTS_END}" \
        '$0 == b {on = 1; next} $0 == e {on = 0} on && $2 ~ /^orch-n[0-9]+$/ {n++} END {print n + 0}' /etc/hosts
}

remove_hosts_block() {
    replace_block /etc/hosts "${ORCH_HOSTS_BEGIN}" "${ORCH_HOSTS_END}" ""
}

# pid_alive PIDFILE [COMM]: the pid in PIDFILE runs (and its command name starts with COMM, if given).
pid_alive() {
    local pidfile="$1" comm="${2:-}" pid name
    [[ -s "${pidfile}" ]] || return 1
    pid="$(tr -dc '0-9' <"${pidfile}")"
    [[ -n "${pid}" ]] && pid_running "${pid}" || return 1
    if [[ -n "${comm}" ]]; then
        name="$(cat "/proc/${pid}/comm" 2>/dev/null || true)"
        [[ "${name}" == "${comm}"* ]] || return 1
    fi
}

# stop_pidfiles PIDFILE:COMM...: TERM every listed daemon that runs, KILL those still there after 10 s,
# remove the pid files. All at once: each daemon takes about 2 s to exit.
stop_pidfiles() {
    local entry pidfile comm pid pids=() i
    for entry in "$@"; do
        pidfile="${entry%:*}"
        comm="${entry##*:}"
        if pid_alive "${pidfile}" "${comm}"; then
            pid="$(tr -dc '0-9' <"${pidfile}")"
            kill -TERM "${pid}" 2>/dev/null || true
            pids+=("${pid}")
        fi
    done
    for ((i = 0; i < 200; i++)); do
        any_pid_alive "${pids[@]}" || break
        sleep 0.05
    done
    for pid in "${pids[@]}"; do
        if pid_running "${pid}"; then
            say "pid ${pid} ($(cat "/proc/${pid}/comm" 2>/dev/null)) ignored SIGTERM for 10 s; sending SIGKILL"
            kill -KILL "${pid}" 2>/dev/null || true
        fi
    done
    for entry in "$@"; do
        rm -f "${entry%:*}"
    done
}

# pid_running PID: the process exists and is not a zombie (this machine's init may reap late).
pid_running() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ "${stat:0:1}" != Z ]]
}

any_pid_alive() {
    local pid
    for pid in "$@"; do
        pid_running "${pid}" && return 0
    done
    return 1
}

# wait_pidfile PIDFILE COMM SECONDS: wait until a daemonizing program has written a live pid file.
wait_pidfile() {
    local pidfile="$1" comm="$2" seconds="$3" i
    for ((i = 0; i < seconds * 10; i++)); do
        pid_alive "${pidfile}" "${comm}" && return 0
        sleep 0.1
    done
    return 1
}

# show_logs FILE...: the last lines of each log, for error messages.
show_logs() {
    local f
    for f in "$@"; do
        [[ -e "${f}" ]] || continue
        printf '\n--- last lines of %s ---\n' "${f}" >&2
        tail -n 15 "${f}" >&2
    done
}

# Print each NAME=value line of an env file as an `export` line (for `eval "$(... env)"`).
print_exports() {
    local file="$1" line
    while IFS= read -r line; do
        printf 'export %s\n' "${line}"
    done <"${file}"
}

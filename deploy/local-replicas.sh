#!/usr/bin/env bash
# The compose topology without containers, for a laptop or CI: a throw-away
# PostgreSQL, one schema upgrade, the simulated provider and two replicas of
# `reconciler serve --no-migrate` on 127.0.0.1, all sharing the database.
#
#   deploy/local-replicas.sh start [--foreground]   start everything, wait until ready
#   deploy/local-replicas.sh stop                    stop what `start` started, by PID
#   deploy/local-replicas.sh status                  show the state file and liveness
#
# Environment:
#   STATE_DIR      where replicas.env (PIDs, URLs, paths) is kept
#                  (default: ${TMPDIR:-/tmp}/reconciler-replicas-$UID)
#   READY_TIMEOUT  seconds to wait for both /readyz (default 60)
#   STOP_TIMEOUT   seconds to wait for each process to exit before SIGKILL (default 10)
#   PGBIN          directory of initdb/pg_ctl (default: from PATH, else
#                  /usr/lib/postgresql/15/bin)
#
# Secrets are generated for each run into an env file of mode 600 in the run's
# directory; they are passed to the processes through the environment, never argv.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE_DIR="${STATE_DIR:-${TMPDIR:-/tmp}/reconciler-replicas-$(id -u)}"
STATE_FILE="$STATE_DIR/replicas.env"
READY_TIMEOUT="${READY_TIMEOUT:-60}"
STOP_TIMEOUT="${STOP_TIMEOUT:-10}"
STEP_TIMEOUT=60 # bound on one set-up step (initdb, pg_ctl start, db upgrade)
RUN_PREFIX="reconciler-replicas."

if [[ -x "$REPO_ROOT/.venv/bin/reconciler" ]]; then
    SERVICE_BIN="$REPO_ROOT/.venv/bin/reconciler"
    PYTHON="$REPO_ROOT/.venv/bin/python"
else
    SERVICE_BIN="$(command -v reconciler || true)"
    PYTHON="$(command -v python3 || true)"
fi

die() {
    echo "local-replicas: $*" >&2
    exit 1
}

log() {
    echo "local-replicas: $*" >&2
}

# --- small helpers -----------------------------------------------------------------

with_timeout() {
    # Prints the prefix that bounds a command, when coreutils' timeout exists.
    if command -v timeout >/dev/null 2>&1; then
        echo "timeout $1"
    fi
}

bounded() {
    # bounded SECONDS CMD...: fail rather than hang.
    local -a prefix
    read -r -a prefix <<<"$(with_timeout "$1")"
    shift
    "${prefix[@]}" "$@"
}

is_root() {
    [[ "$(id -u)" == "0" ]]
}

as_pg() {
    # as_pg SECONDS CMD...: bounded, and as the postgres user when we are root
    # (PostgreSQL refuses to run as root).
    local -a prefix
    read -r -a prefix <<<"$(with_timeout "$1")"
    shift
    if is_root; then
        prefix+=(runuser -u postgres --)
    fi
    "${prefix[@]}" "$@"
}

alive() {
    # A PID counts as alive if it exists and is not a zombie (an orphan whose parent
    # does not reap it still answers kill -0).
    local pid="$1" stat rest
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    if [[ -r "/proc/$pid/stat" ]]; then
        stat="$(<"/proc/$pid/stat")" || return 1
        rest="${stat##*) }"
        [[ "${rest%% *}" != "Z" ]] || return 1
    fi
    return 0
}

is_ours() {
    # Guards against a recycled PID: the command line must still name what we started.
    local pid="$1" pattern="$2" cmdline
    if [[ -r "/proc/$pid/cmdline" ]]; then
        cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
        [[ "$cmdline" == *"$pattern"* ]]
    else
        return 0
    fi
}

free_port() {
    "$PYTHON" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

random_hex() {
    "$PYTHON" -c 'import secrets, sys; print(secrets.token_hex(int(sys.argv[1])))' "$1"
}

random_whsec() {
    "$PYTHON" -c 'import base64, secrets; print("whsec_" + base64.b64encode(secrets.token_bytes(32)).decode())'
}

http_status() {
    # Prints the HTTP status of a GET (000 when there is no answer).
    "$PYTHON" - "$1" <<'PY'
import sys
import urllib.error
import urllib.request

try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as response:
        print(response.status)
except urllib.error.HTTPError as exc:
    print(exc.code)
except Exception:
    print("000")
PY
}

find_pgbin() {
    if [[ -n "${PGBIN:-}" ]]; then
        echo "$PGBIN"
    elif command -v initdb >/dev/null 2>&1; then
        # Resolved: a PATH entry is often a symlink to initdb alone, without createdb.
        dirname "$(readlink -f "$(command -v initdb)")"
    else
        echo /usr/lib/postgresql/15/bin
    fi
}

# --- the state file ----------------------------------------------------------------

record() {
    # record KEY VALUE: append one line; written as each piece starts, so that a failed
    # start can be cleaned up by the same code as `stop`.
    local key="$1" value="$2"
    [[ "$value" =~ ^[A-Za-z0-9_./:@-]*$ ]] || die "refusing to record an unsafe value for $key"
    echo "$key=$value" >>"$STATE_FILE"
}

declare -A STATE=()

load_state() {
    # Parsed, never sourced: the file is data.
    local key value
    STATE=()
    [[ -f "$STATE_FILE" ]] || return 1
    while IFS='=' read -r key value; do
        [[ "$key" =~ ^[A-Z0-9_]+$ ]] || continue
        STATE["$key"]="$value"
    done <"$STATE_FILE"
}

state() {
    echo "${STATE[$1]:-}"
}

# --- stopping ----------------------------------------------------------------------

stop_pid() {
    local name="$1" pid="$2" pattern="$3" waited=0
    [[ -n "$pid" ]] || return 0
    if ! alive "$pid"; then
        return 0
    fi
    if ! is_ours "$pid" "$pattern"; then
        log "$name: PID $pid is no longer ours; leaving it alone"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    while alive "$pid" && ((waited < STOP_TIMEOUT * 10)); do
        sleep 0.1
        waited=$((waited + 1))
    done
    if alive "$pid"; then
        log "$name: PID $pid did not stop within ${STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
}

stop_postgres() {
    local pgbin pgdata pid
    pgbin="$(state PG_BIN)"
    pgdata="$(state PG_DATA)"
    pid="$(state PG_PID)"
    if [[ -n "$pgdata" && -f "$pgdata/postmaster.pid" ]]; then
        (cd "$(state PG_ROOT)" && as_pg "$((STOP_TIMEOUT + 5))" \
            "$pgbin/pg_ctl" -D "$pgdata" -m fast -w -t "$STOP_TIMEOUT" stop >/dev/null 2>&1) || true
    fi
    stop_pid postgres "$pid" postgres
}

remove_run_dir() {
    # Only directories this script made (mktemp with our prefix) are removed.
    local dir="$1"
    [[ -n "$dir" && -d "$dir" ]] || return 0
    [[ "$(basename "$dir")" == "$RUN_PREFIX"* ]] || {
        log "not removing $dir: not a directory this script created"
        return 0
    }
    rm -rf -- "$dir"
}

stop_all() {
    load_state || return 0
    stop_pid reconciler-1 "$(state REPLICA_1_PID)" reconciler
    stop_pid reconciler-2 "$(state REPLICA_2_PID)" reconciler
    stop_pid provider-sim "$(state SIM_PID)" reconciler.demo.sim
    stop_postgres
    remove_run_dir "$(state RUN_DIR)"
    remove_run_dir "$(state PG_ROOT)"
    rm -f -- "$STATE_FILE"
}

cmd_stop() {
    if [[ ! -f "$STATE_FILE" ]]; then
        log "nothing to stop ($STATE_FILE not found)"
        return 0
    fi
    stop_all
    log "stopped"
}

# --- starting ----------------------------------------------------------------------

start_postgres() {
    local pgbin="$1" pgroot pgport password
    [[ -x "$pgbin/initdb" && -x "$pgbin/pg_ctl" && -x "$pgbin/createdb" ]] ||
        die "PostgreSQL binaries not found in $pgbin (set PGBIN)"
    if is_root; then
        id postgres >/dev/null 2>&1 || die "running as root needs a 'postgres' user"
    fi
    pgroot="$(mktemp -d "${TMPDIR:-/tmp}/${RUN_PREFIX}pg.XXXXXX")"
    record PG_ROOT "$pgroot"
    record PG_BIN "$pgbin"
    record PG_DATA "$pgroot/data"
    password="$(random_hex 24)"
    (umask 077 && printf '%s\n' "$password" >"$pgroot/pwfile")
    if is_root; then chown -R postgres "$pgroot"; fi
    pgport="$(free_port)"
    # Host connections need the password; the socket lives in a directory only the
    # cluster's owner can enter.
    (cd "$pgroot" && as_pg "$STEP_TIMEOUT" "$pgbin/initdb" -D "$pgroot/data" \
        -U reconciler --pwfile="$pgroot/pwfile" --auth-local=trust \
        --auth-host=scram-sha-256 --no-sync >"$pgroot/initdb.log" 2>&1) ||
        die "initdb failed; see $pgroot/initdb.log"
    rm -f -- "$pgroot/pwfile"
    (cd "$pgroot" && as_pg "$STEP_TIMEOUT" "$pgbin/pg_ctl" -D "$pgroot/data" \
        -l "$pgroot/server.log" -w -t "$STEP_TIMEOUT" \
        -o "-p $pgport -k $pgroot -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null 2>&1) ||
        die "PostgreSQL did not start; see $pgroot/server.log"
    record PG_PID "$(head -n 1 "$pgroot/data/postmaster.pid")"
    record PG_PORT "$pgport"
    (cd "$pgroot" && as_pg "$STEP_TIMEOUT" "$pgbin/createdb" -h "$pgroot" \
        -p "$pgport" -U reconciler reconciler) || die "createdb failed"
    DATABASE_URL="postgresql+psycopg://reconciler:${password}@127.0.0.1:${pgport}/reconciler"
}

write_env_file() {
    local file="$1"
    (
        umask 077
        {
            echo "RECONCILER_DATABASE_URL=$DATABASE_URL"
            echo "RECONCILER_CALLBACK_SECRET=$(random_whsec)"
            echo "RECONCILER_AUDIT_KEY=$(random_hex 32)"
            echo "SIM_TOKEN=$(random_hex 24)"
            echo "SIM_WEBHOOK_SECRETS=$(random_whsec)"
        } >"$file"
    )
}

write_config() {
    local run_dir="$1" sim_port="$2"
    mkdir -p "$run_dir/providers"
    # The simulator's provider file, pointed at this run's simulator.
    sed -e "s#^base_url = .*#base_url = \"http://127.0.0.1:${sim_port}\"#" \
        "$REPO_ROOT/service/reconciler/demo/sim/sim.toml" >"$run_dir/providers/sim.toml"
    grep -q "^base_url = \"http://127.0.0.1:${sim_port}\"" "$run_dir/providers/sim.toml" ||
        die "could not point providers/sim.toml at the simulator"
    cat >"$run_dir/reconciler.toml" <<EOF
providers_dir = "providers"
log_level = "INFO"

[server]
host = "127.0.0.1"

[scheduler]
tick_seconds = 0.5
EOF
}

start_replica() {
    local index="$1" port="$2" run_dir="$3"
    RECONCILER_SERVER_PORT="$port" "$SERVICE_BIN" serve --no-migrate \
        --config "$run_dir/reconciler.toml" \
        >"$run_dir/reconciler-$index.log" 2>&1 </dev/null &
    record "REPLICA_${index}_PID" "$!"
    record "REPLICA_${index}_URL" "http://127.0.0.1:$port"
}

wait_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT)) index pid url pending
    while :; do
        pending=0
        for index in 1 2; do
            pid="$(state "REPLICA_${index}_PID")"
            url="$(state "REPLICA_${index}_URL")"
            if ! alive "$pid"; then
                log "reconciler-$index exited during start-up; last lines of its log:"
                tail -n 20 "$(state RUN_DIR)/reconciler-$index.log" >&2 || true
                return 1
            fi
            [[ "$(http_status "$url/readyz")" == "200" ]] || pending=1
        done
        alive "$(state SIM_PID)" || {
            log "provider-sim exited during start-up; last lines of its log:"
            tail -n 20 "$(state RUN_DIR)/provider-sim.log" >&2 || true
            return 1
        }
        ((pending == 0)) && return 0
        if ((SECONDS >= deadline)); then
            log "the replicas were not ready within ${READY_TIMEOUT}s"
            return 1
        fi
        sleep 0.2
    done
}

start_all() {
    local run_dir sim_port port_1 port_2 sim_pid
    [[ -n "$SERVICE_BIN" ]] || die "no reconciler command: create .venv or put reconciler on PATH"
    [[ -n "$PYTHON" ]] || die "python3 not found"
    mkdir -p "$STATE_DIR"
    if [[ -f "$STATE_FILE" ]]; then
        die "already started ($STATE_FILE exists); run '$0 stop' first"
    fi
    : >"$STATE_FILE"
    chmod 600 "$STATE_FILE"

    run_dir="$(mktemp -d "${TMPDIR:-/tmp}/${RUN_PREFIX}run.XXXXXX")"
    record RUN_DIR "$run_dir"
    record ENV_FILE "$run_dir/secrets.env"

    start_postgres "$(find_pgbin)"
    write_env_file "$run_dir/secrets.env"

    sim_port="$(free_port)"
    port_1="$(free_port)"
    port_2="$(free_port)"
    while [[ "$port_2" == "$port_1" || "$port_2" == "$sim_port" || "$port_1" == "$sim_port" ]]; do
        port_1="$(free_port)"
        port_2="$(free_port)"
    done
    write_config "$run_dir" "$sim_port"

    set -a
    # shellcheck source=/dev/null
    source "$run_dir/secrets.env"
    set +a

    bounded "$STEP_TIMEOUT" "$SERVICE_BIN" db upgrade --config "$run_dir/reconciler.toml" \
        >"$run_dir/migrate.log" 2>&1 || die "reconciler db upgrade failed; see $run_dir/migrate.log"

    (cd "$REPO_ROOT" && exec "$PYTHON" -m reconciler.demo.sim --host 127.0.0.1 \
        --port "$sim_port" --webhook-url "http://127.0.0.1:$port_1/webhooks/sim" \
        >"$run_dir/provider-sim.log" 2>&1 </dev/null) &
    sim_pid="$!"
    record SIM_PID "$sim_pid"
    record SIM_URL "http://127.0.0.1:$sim_port"

    start_replica 1 "$port_1" "$run_dir"
    start_replica 2 "$port_2" "$run_dir"
    load_state
    wait_ready
}

print_urls() {
    cat <<EOF
reconciler-1  $(state REPLICA_1_URL)
reconciler-2  $(state REPLICA_2_URL)
provider-sim  $(state SIM_URL)
database      postgresql://reconciler@127.0.0.1:$(state PG_PORT)/reconciler
secrets       $(state ENV_FILE)
state         $STATE_FILE
EOF
}

on_failed_start() {
    local status=$?
    if ((status != 0)); then
        log "start failed; stopping what was started"
        stop_all
    fi
    exit "$status"
}

on_foreground_exit() {
    trap - EXIT INT TERM
    stop_all
    log "stopped"
}

cmd_start() {
    local foreground=0
    case "${1:-}" in
        "") ;;
        --foreground) foreground=1 ;;
        *) die "unknown option: $1" ;;
    esac
    trap on_failed_start EXIT
    trap 'exit 130' INT TERM
    start_all
    trap - EXIT INT TERM
    print_urls
    if ((foreground)); then
        trap on_foreground_exit EXIT
        trap 'exit 130' INT TERM
        log "running in the foreground; Ctrl-C stops everything"
        # Returns when any of them exits; the EXIT trap then stops the rest.
        wait -n "$(state SIM_PID)" "$(state REPLICA_1_PID)" "$(state REPLICA_2_PID)" || true
        log "a process exited; stopping the rest"
        exit 1
    fi
}

cmd_status() {
    local key pid
    load_state || {
        echo "not running"
        return 0
    }
    for key in PG_PID SIM_PID REPLICA_1_PID REPLICA_2_PID; do
        pid="$(state "$key")"
        if alive "$pid"; then echo "$key=$pid running"; else echo "$key=$pid gone"; fi
    done
    print_urls
}

main() {
    local command="${1:-}"
    shift || true
    case "$command" in
        start) cmd_start "$@" ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        *)
            echo "usage: $0 start [--foreground] | stop | status" >&2
            exit 2
            ;;
    esac
}

main "$@"

#!/bin/sh
# Simulated services for the offline demo: status, logs and restart, deterministic and local.
# Arguments arrive as separate argv elements (the catalog never uses a shell to build them).
set -eu

# Kestrel sets KESTREL_DEMO_STATE to .kestrel-demo beside the journal: each folder its own state.
state_dir="${KESTREL_DEMO_STATE:-$PWD/.kestrel-demo}"
state_file="$state_dir/restarts.log"

restarts() {
    [ -f "$state_file" ] || { echo 0; return; }
    grep -cx "restart $1" "$state_file" || true
}

status() {
    count=$(restarts "$1")
    checked_file="$state_dir/$1.checked"
    checked=$(cat "$checked_file" 2>/dev/null || echo 0)
    if [ "$count" -gt "$checked" ]; then
        # The first check after a restart sees the service healthy; checkout's leak brings
        # it down again by the next one, so the demo incident can be played again.
        echo "$count" > "$checked_file"
        echo "$1: active (running) for 0 days; restarted via kestrel $count time(s)"
        return
    fi
    case "$1" in
        checkout) if [ "$count" -gt 0 ]; then
                echo "checkout: degraded: OOM-killed again since its last restart; memory 1.9G of 2.0G limit"
            else
                echo "checkout: degraded: OOM-killed 3 times in the last hour; memory 1.9G of 2.0G limit"
            fi ;;
        payments) echo "payments: active (running) for 6 days; memory 412M of 1.0G limit" ;;
        search) echo "search: active (running) for 2 days; memory 780M of 2.0G limit" ;;
    esac
}

logs() {
    case "$1" in
        checkout) cat <<'LOG'
09:41:02 INFO  checkout: handled 1204 requests (p99 840ms)
09:41:37 WARN  checkout: heap at 93% of limit, GC pause 1.2s
09:41:58 WARN  checkout: cart cache grew to 1.6G (no eviction configured)
09:42:05 ERROR kernel: Memory cgroup out of memory: Killed process 4182 (checkout)
09:42:05 ERROR systemd: checkout.service: Main process exited, status=9/KILL
09:42:06 INFO  systemd: checkout.service: Scheduled restart job, restart counter is at 3
09:42:09 INFO  checkout: started, warming cart cache
LOG
        ;;
        payments) printf '%s\n' "09:40:11 INFO  payments: handled 311 requests (p99 120ms)" \
            "09:41:11 INFO  payments: handled 298 requests (p99 118ms)" ;;
        search) printf '%s\n' "09:40:30 INFO  search: index refresh took 2.1s" \
            "09:41:30 INFO  search: handled 2210 queries (p99 95ms)" ;;
    esac | tail -n "$2"
}

restart() {
    mkdir -p "$state_dir"
    # Simulated state, never anyone's work: git ignores the whole folder.
    [ -f "$state_dir/.gitignore" ] || echo '*' > "$state_dir/.gitignore"
    echo "restart $1" >> "$state_file"
    echo "$1: restarted (recorded in $state_file)"
}

command="${1:-}"
service="${2:-}"
case "$service" in
    checkout|payments|search) ;;
    *) echo "unknown service: $service (known: checkout, payments, search)"; exit 4 ;;
esac
case "$command" in
    status) status "$service" ;;
    logs) logs "$service" "${3:-20}" ;;
    restart) restart "$service" ;;
    *) echo "usage: fake_ops.sh status|logs|restart SERVICE [LINES]"; exit 2 ;;
esac

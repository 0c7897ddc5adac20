#!/usr/bin/env bash
# Replica fail-over, measured (docs/ha.md, docs/benchmarks.md): N agents of one job (one
# fixture worker each, sleeping) on ddprund replicas over a real 3-member etcd on loopback.
# kill -9 the leading replica, and time until every agent has re-attached ("re-attached" in its
# log), checking that no worker was restarted. Its peer in the same run: one ddprund with
# --state_dir, kill -9 and started again at once on the same port (the single-daemon fail-over).
# Also prints etcd writes for the round (etcd's revision before and after: one per write).
#
#   bench/ha_failover.sh [N=16] [BUILD_DIR=build]
set -euo pipefail
N=${1:-16}
BIN=${2:-build}/bin
[ -x /usr/bin/etcd ] || { echo "no /usr/bin/etcd (install etcd-server)"; exit 2; }
DIR=$(mktemp -d /tmp/ddprun-ha-bench-XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$DIR"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
now() { date +%s.%N; }

# --- a 3-member etcd
CL=""; EPS=""
declare -a CP PP
for i in 0 1 2; do CP[$i]=$(free_port); PP[$i]=$(free_port); CL+="${CL:+,}e$i=http://127.0.0.1:${PP[$i]}"; EPS+="${EPS:+,}127.0.0.1:${CP[$i]}"; done
for i in 0 1 2; do
  /usr/bin/etcd --name e$i --data-dir "$DIR/e$i" --listen-client-urls http://127.0.0.1:${CP[$i]} \
    --advertise-client-urls http://127.0.0.1:${CP[$i]} --listen-peer-urls http://127.0.0.1:${PP[$i]} \
    --initial-advertise-peer-urls http://127.0.0.1:${PP[$i]} --initial-cluster "$CL" \
    --heartbeat-interval 50 --election-timeout 500 --logger zap --log-level error \
    >"$DIR/e$i.log" 2>&1 &
  PIDS+=($!)
done
until ETCDCTL_API=3 etcdctl --endpoints "$EPS" put /bench ok >/dev/null 2>&1; do sleep 0.1; done
revision() { ETCDCTL_API=3 etcdctl --endpoints "$EPS" endpoint status -w fields 2>/dev/null | awk '/"Revision"/{print $3; exit}'; }

wait_line() {  # file text timeout_s
  local t0; t0=$(now)
  until grep -q "$2" "$1" 2>/dev/null; do
    sleep 0.01
    if (( $(echo "$(now) - $t0 > $3" | bc) )); then echo "timeout waiting for '$2' in $1" >&2; return 1; fi
  done
}

# Starts N agents against $1; waits until N workers run.
start_job() {
  local eps=$1 tag=$2
  mkdir -p "$DIR/$tag/pids"
  for ((i = 0; i < N; i++)); do
    FIXTURE_PIDFILE_DIR="$DIR/$tag/pids" FIXTURE_SLEEP_MS=60000 "$BIN/ddprun" --nnodes=$N \
      --nproc_per_node=1 --rdzv_endpoint="$eps" --rdzv_id="$tag" --rdzv_conf=join_timeout=60 \
      --local_addr=127.0.0.1 "$BIN/fixture_worker" >"$DIR/$tag/a$i.out" 2>"$DIR/$tag/a$i.err" &
    PIDS+=($!)
  done
  until [ "$(ls "$DIR/$tag/pids" | wc -l)" -ge "$N" ]; do sleep 0.02; done
  cat "$DIR/$tag/pids"/* | sort >"$DIR/$tag/workers.before"
}

# With LEADER set (the killed replica), also records T_LEAD: when another replica leads.
T_LEAD=""
all_reattached() {  # tag timeout_s
  local t0; t0=$(now)
  while true; do
    if [ -n "${LEADER:-}" ] && [ -z "$T_LEAD" ]; then
      for i in 0 1 2; do
        [ "$i" != "$LEADER" ] && grep -q "leads the control plane" "$DIR/r$i.err" 2>/dev/null &&
          T_LEAD=$(echo "$(now) - $t0" | bc)
      done
    fi
    local n; n=$( (grep -l "re-attached" "$DIR/$1"/a*.err 2>/dev/null || true) | wc -l)
    [ "$n" -ge "$N" ] && return 0
    if (( $(echo "$(now) - $t0 > $2" | bc) )); then echo "only $n of $N agents re-attached" >&2; return 1; fi
    sleep 0.01
  done
}

# --- replicas on etcd
declare -a RP RPID
REPS=""
for i in 0 1 2; do
  RP[$i]=$(free_port)
  "$BIN/ddprund" --host 127.0.0.1 --port ${RP[$i]} --dashboard_port 0 --etcd_endpoints "$EPS" --etcd_lease_ttl 1 \
    >"$DIR/r$i.out" 2>"$DIR/r$i.err" &
  RPID[$i]=$!; PIDS+=($!)
  REPS+="${REPS:+,}127.0.0.1:${RP[$i]}"
done
LEADER=""
until [ -n "$LEADER" ]; do for i in 0 1 2; do grep -q "leads the control plane" "$DIR/r$i.err" 2>/dev/null && LEADER=$i; done; sleep 0.01; done
REV0=$(revision)
T0=$(now)
start_job "$REPS" ha
T_ROUND=$(echo "$(now) - $T0" | bc)
REV1=$(revision)
T0=$(now)
kill -9 ${RPID[$LEADER]}
all_reattached ha 30
T_HA=$(echo "$(now) - $T0" | bc)
LEADER=""
cat "$DIR/ha/pids"/* | sort >"$DIR/ha/workers.after"
cmp -s "$DIR/ha/workers.before" "$DIR/ha/workers.after" && TOUCHED=no || TOUCHED=yes
for p in $(cat "$DIR/ha/workers.before"); do kill -0 "$p" 2>/dev/null || TOUCHED=yes; done

# --- peer: one ddprund with --state_dir, killed and restarted at once
SP=$(free_port)
"$BIN/ddprund" --host 127.0.0.1 --port $SP --dashboard_port 0 --state_dir "$DIR/state" >"$DIR/s.out" 2>"$DIR/s.err" &
SPID=$!; PIDS+=($!)
wait_line "$DIR/s.out" "listening" 10
T0=$(now)
start_job "127.0.0.1:$SP" single
T_SROUND=$(echo "$(now) - $T0" | bc)
T0=$(now)
kill -9 $SPID
"$BIN/ddprund" --host 127.0.0.1 --port $SP --dashboard_port 0 --state_dir "$DIR/state" >"$DIR/s2.out" 2>"$DIR/s2.err" &
PIDS+=($!)
all_reattached single 30
T_SINGLE=$(echo "$(now) - $T0" | bc)

printf 'agents: %d (one worker each), etcd: 3 members on loopback, lease TTL 1 s\n' "$N"
printf 'round of %d agents through the replicas (start to every worker running): %.3f s, etcd writes: %d\n' \
  "$N" "$T_ROUND" "$((REV1 - REV0))"
printf 'peer: the same round on one ddprund (--state_dir): %.3f s\n' "$T_SROUND"
printf 'replica kill -9 -> a standby leads: %.3f s, every agent re-attached: %.3f s (workers touched: %s)\n' \
  "${T_LEAD:-0}" "$T_HA" "$TOUCHED"
printf 'peer: single ddprund --state_dir kill -9 + immediate restart -> every agent re-attached: %.3f s\n' "$T_SINGLE"
printf 'ratio replicas/single: %.2f\n' "$(echo "$T_HA / $T_SINGLE" | bc -l)"

#!/usr/bin/env bash
# etcd writes per round for large jobs (docs/ha.md "Large jobs and etcd's request limit",
# docs/benchmarks.md): one etcd member on loopback started with --max-request-bytes LIMIT, and
# `rendezvous_bench --restart N` against it as a replica (DDPRUN_BENCH_ETCD): 3 runs, each a
# fresh replica (one election write) whose job of N simulated agents forms a round, has one
# failure and forms the next round (3 job snapshots). Prints etcd's revision growth per run (one
# per write transaction) and the bench's own table.
#
#   bench/etcd_snapshot_writes.sh [N=16384] [LIMIT=1572864] [BUILD_DIR=build]
set -euo pipefail
N=${1:-16384}
LIMIT=${2:-1572864}
BIN=${3:-build}/bin
[ -x /usr/bin/etcd ] || { echo "no /usr/bin/etcd (install etcd-server)"; exit 2; }
DIR=$(mktemp -d /tmp/ddprun-etcd-size-XXXXXX)
PID=""
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
CP=$(free_port); PP=$(free_port)
/usr/bin/etcd --name e0 --data-dir "$DIR/e0" --listen-client-urls "http://127.0.0.1:$CP" \
  --advertise-client-urls "http://127.0.0.1:$CP" --listen-peer-urls "http://127.0.0.1:$PP" \
  --initial-advertise-peer-urls "http://127.0.0.1:$PP" --initial-cluster "e0=http://127.0.0.1:$PP" \
  --max-request-bytes "$LIMIT" --logger zap --log-level error >"$DIR/e0.log" 2>&1 &
PID=$!
EPS="127.0.0.1:$CP"
until ETCDCTL_API=3 etcdctl --endpoints "$EPS" put /bench ok >/dev/null 2>&1; do sleep 0.1; done
revision() { ETCDCTL_API=3 etcdctl --endpoints "$EPS" endpoint status -w fields 2>/dev/null | awk '/"Revision"/{print $3; exit}'; }
R0=$(revision)
DDPRUN_BENCH_ETCD="$EPS" DDPRUN_BENCH_ETCD_MAX_REQUEST_BYTES="$LIMIT" "$BIN/rendezvous_bench" --restart "$N"
R1=$(revision)
echo "N=$N etcd --max-request-bytes=$LIMIT: etcd revision +$((R1 - R0)) over 3 runs ($(( (R1 - R0) / 3 )) per run: election + form + restart + re-form, store untouched)"

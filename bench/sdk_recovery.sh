#!/bin/bash
# Issue 29's SDK goals, from the repository root: 4 ranks of the in-place SDK
# trainer (tests/sdk/worker/inplace_trainer.cc) under ddprun, rank 2 kill -9'd
# (it SIGKILLs itself) at step 50, RUNS times per CPU transport (shared memory,
# and DDP_SHM=0: Gloo over TCP):
#   lost   the survivors' failing collective: from the kill to PeerLostError
#          (goal <= 100 ms); every survivor of every run;
#   form   under --restart_policy=inplace (when this ddprun has it): from the
#          agent's new round in the control block (state ready) to the new
#          group formed (goal <= 100 ms), Reconfigure's formed_ms (DDPRUN_DEBUG=sdk);
#          it includes waiting for the replacement process to reach ddp::Init;
#   wait   the same survivors' wait for the agent's new round (waited_ms);
#   init   the first ddp::Init of round 0's workers: each rank's group
#          bootstrap (ConnectBackend's "connected after", DDPRUN_DEBUG=sdk),
#          which includes waiting for the last rank to start.
# And, with the agent played by a test (tests/sdk/reform_sdk_test.cc: the
# replacement is started first, the round published once it is in ddp::Init),
# RUNS runs of both transports:
#   form*  from the round published, with the replacement ready, to the
#          survivors' new group formed (Reconfigure's formed_ms; goal <= 100 ms).
#   bench/sdk_recovery.sh [build-dir]     (default: build; RUNS=5)
# Prints one line per transport and figure: n, median, p90, max in ms.
set -eu
B=${1:-build}
RUNS=${RUNS:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
policy=()
if "$B/bin/ddprun" --help 2>&1 | grep -q -- "--restart_policy"; then
  policy=(--restart_policy=inplace --max_restarts=3)
fi

stats() {  # stdin: one number a line -> "n=N median=.. p90=.. max=.."
  sort -g | awk '{v[NR]=$1} END {if (NR==0) {print "n=0"; exit}
    printf "n=%d median=%.1f p90=%.1f max=%.1f\n", NR, v[int((NR+1)/2)], v[int(NR*0.9+0.999)], v[NR]}'
}

for shm in 1 0; do
  name=$([[ $shm == 1 ]] && echo shm || echo tcp)
  : >"$out/$name.log"
  for run in $(seq "$RUNS"); do
    DDP_SHM=$shm DDP_TIMEOUT_SEC=30 DDPRUN_DEBUG=sdk TRAINER_OUT="$out/t$run$name" \
      TRAINER_STEPS=120 TRAINER_KILL_RANK=2 TRAINER_KILL_STEP=50 \
      "$B/bin/ddprun" --nproc_per_node=4 --grace_period=20 "${policy[@]}" --no_python \
      "$B/bin/inplace_trainer" >>"$out/$name.log" 2>&1 || true
  done
  echo "$name init:  $(grep 'round 0 rank [0-9]*\] group ddp/pg0/: connected after' "$out/$name.log" |
    sed 's/.*connected after \([0-9.]*\) ms.*/\1/' | stats)"
  echo "$name lost:  $(grep -o 'lost_ms=[0-9.]*' "$out/$name.log" | cut -d= -f2 | stats)"
  if [[ ${#policy[@]} -gt 0 ]]; then
    echo "$name form:  $(grep -o 'formed_ms=[0-9.]*' "$out/$name.log" | cut -d= -f2 | stats)"
    echo "$name wait:  $(grep -o 'waited_ms=[0-9.]*' "$out/$name.log" | cut -d= -f2 | stats)"
  else
    echo "$name form:  SKIPPED: this ddprun has no --restart_policy (the in-place agent)"
  fi
done

: >"$out/reform.log"
for run in $(seq "$RUNS"); do
  "$B/bin/sdk_tests" "Reconfigure: survivors*" >>"$out/reform.log" 2>&1 || echo "reform run $run failed" >&2
done
for name in shm tcp; do
  echo "$name form*: $(grep "re-form ($name).*formed" "$out/reform.log" |
    sed 's/.*group \([0-9.]*\) ms.*/\1/' | stats)"
done

#!/usr/bin/env bash
# [install] tier: the shell completion the packages ship (`ddprun completion bash|zsh`).
#   tests/install/completion_test.sh BUILD_DIR
# Sources the bash script in a bash and asks it what `ddprun --nproc`, `ddprun st`,
# `ddprun --rdzv_backend ` and `ddprun completion ` complete to (in an empty directory,
# so that no file name mixes in); checks the zsh script parses (zsh -n) when zsh is
# installed; an unknown shell is a one-line usage error (exit 2).
set -euo pipefail
ddprun=$(realpath "$1")/bin/ddprun
tmp=$(realpath "$(mktemp -d)")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "completion_test: FAIL: $*" >&2; exit 1; }

"$ddprun" completion bash >"$tmp/ddprun.bash" || fail "ddprun completion bash"
bash -n "$tmp/ddprun.bash" || fail "the bash script does not parse"
mkdir "$tmp/empty"
# complete LINE: the words the script offers for the last word of LINE.
complete_line() {
  (cd "$tmp/empty" && bash -c '
    source "$1"; shift
    read -r -a COMP_WORDS <<<"$1"
    [[ "$1" == *" " ]] && COMP_WORDS+=("")
    COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
    _ddprun
    printf "%s\n" "${COMPREPLY[@]}" | sort' _ "$tmp/ddprun.bash" "$1")
}
got=$(complete_line "ddprun --nproc")
[[ "$got" == $'--nproc-per-node\n--nproc_per_node' ]] || fail "ddprun --nproc completes to: $got"
got=$(complete_line "ddprun st")
[[ "$got" == "status" ]] || fail "ddprun st completes to: $got"
got=$(complete_line "ddprun --rdzv_backend ")
[[ "$got" == $'c10d\nstatic' ]] || fail "ddprun --rdzv_backend completes to: $got"
got=$(complete_line "ddprun completion ")
[[ "$got" == $'bash\nzsh' ]] || fail "ddprun completion completes to: $got"

"$ddprun" completion zsh >"$tmp/_ddprun" || fail "ddprun completion zsh"
grep -q "^#compdef ddprun" "$tmp/_ddprun" || fail "the zsh script has no #compdef line"
grep -q "'--nproc_per_node:" "$tmp/_ddprun" || fail "the zsh script has no --nproc_per_node"
if command -v zsh >/dev/null; then zsh -n "$tmp/_ddprun" || fail "the zsh script does not parse"; fi

rc=0
err=$("$ddprun" completion fish 2>&1) || rc=$?
[[ $rc -eq 2 && $(wc -l <<<"$err") -eq 1 && "$err" == *"unknown shell 'fish'"* ]] ||
  fail "ddprun completion fish: exit $rc: $err"
echo "completion_test: PASS"

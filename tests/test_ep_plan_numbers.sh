#!/bin/sh
# test_ep_plan_numbers.sh MOEQ — `moeq ep-plan` reads --ranks and --replicas whole: anything but an integer in
# range exits 2 and names the flag (atoi read "abc" as 0, refused as a missing --ranks, and "2x" as 2).
set -u
M=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
printf '900 10 10 10 50 20 5 5\n' >"$W/stats"
refused() { # WANT ARGS...: exit 2 and WANT on stderr
    want=$1
    shift
    "$M" ep-plan --stats "$W/stats" "$@" >/dev/null 2>"$W/err"
    rc=$?
    [ $rc -eq 2 ] && grep -q -- "$want" "$W/err" || { echo "FAIL: ep-plan $*: exit $rc, $(cat "$W/err")" >&2; exit 1; }
}
refused "--ranks: 'abc' is not an integer" --ranks abc
refused "--ranks: '2x' is not an integer" --ranks 2x
refused "--ranks 0: give 1 or more" --ranks 0
refused "--replicas: 'one' is not an integer" --ranks 2 --replicas one
refused "--replicas -1: give 0 or more" --ranks 2 --replicas -1
"$M" ep-plan --stats "$W/stats" --ranks 2 --replicas 1 | grep -q '^moeq-ep-placement 1 experts=8 ranks=2$' ||
    { echo "FAIL: valid flags" >&2; exit 1; }
echo "ep-plan number checks passed"

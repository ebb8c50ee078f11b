#!/bin/sh
# Runs check_generated and checks its exit status and output.
#
# usage: test_check_generated.sh CHECKER EXPECTED_RC PATTERN [CHECKER ARGS...]
#
# PATTERN is a fixed string that must occur in the checker's combined
# stdout/stderr ('' to skip the check).
set -u
if [ $# -lt 3 ]; then
    echo "usage: $0 CHECKER EXPECTED_RC PATTERN [ARGS...]" >&2
    exit 2
fi
checker=$1
expected_rc=$2
pattern=$3
shift 3

out=$("$checker" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"

if [ "$rc" -ne "$expected_rc" ]; then
    echo "FAIL: expected exit status $expected_rc, got $rc" >&2
    exit 1
fi
if [ -n "$pattern" ]; then
    case $out in
        *"$pattern"*) ;;
        *)
            echo "FAIL: output lacks '$pattern'" >&2
            exit 1
            ;;
    esac
fi
echo "PASS: exit status $rc${pattern:+, found '$pattern'}"
exit 0

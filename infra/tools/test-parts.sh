#!/usr/bin/env bash
# test-parts.sh: runs the parts of `make test` and prints how long each took.
#
#   test-parts.sh "cpu lint go-test" "localcloud infra-check localcloud-e2e" "proof proof"
#
# Each argument is a lane: its name, then its parts (make targets), which
# run one after another; lanes run side by side. With several lanes, a
# lane's output is streamed with its name in front of each line and kept
# in .build/test-<name>.log. The first
# part that fails stops its lane; the others run to their end, and the
# script exits non-zero after printing what failed (from the lanes' logs)
# and every part's time and status.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .build
MAKE=${MAKE:-make}
times=.build/test-times.txt
: >"$times"
start=$(date +%s)
# The machine's busy CPU time (every core's user, nice, system, irq, softirq
# and steal, in seconds), read from /proc/stat at the start and the end, so
# the summary says how much of the wall time the cores were working.
busy() { awk -v hz="$(getconf CLK_TCK)" '/^cpu /{ printf "%d", ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat; }
busy0=$(busy)

# cpu: the CPU seconds (user and system) this shell's finished children
# have used so far, from bash's times, run in this shell (a command
# substitution's subshell would count its own children only). A process
# that outlives its parent (a Ray worker whose raylet was killed) is reaped
# by another and not counted: /proc/stat's figure at the end counts all.
children_cpu() { # file
	times >"$1"
	cpu=$(awk 'END { split($1, u, "m"); split($2, s, "m"); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$1")
}

lane() { # name parts...
	local name=$1 tf cpu
	shift
	tf=$(mktemp)
	for part in "$@"; do
		local s c result=ok
		s=$(date +%s)
		children_cpu "$tf"
		c=$cpu
		$MAKE --no-print-directory "$part" || result=FAILED
		children_cpu "$tf"
		echo "$part $(($(date +%s) - s)) $((cpu - c)) $result" >>"$times"
		[ $result = ok ] || { rm -f "$tf"; return 1; }
	done
	rm -f "$tf"
}

pids=()
names=()
lanes=$#
for l in "$@"; do
	# shellcheck disable=SC2086
	set -- $l
	name=$1
	names+=("$name")
	shift
	if [ "$lanes" -eq 1 ]; then
		lane "$name" "$@" & # one lane: its output as it is
	else
		(lane "$name" "$@" 2>&1 | tee ".build/test-$name.log" | sed -u "s/^/[$name] /") &
	fi
	pids+=($!)
done
status=0
for p in "${pids[@]}"; do
	wait "$p" || status=1
done
# A lane's pipeline hides its exit status from wait: read it from the times.
grep -q FAILED "$times" && status=1

# What failed, from each lane's log, just above the times, so the last lines
# of a CI log name the failing tests: each "--- FAIL" with the lines of its
# test's log under it, panics, packages that failed, make's errors.
if [ $status -ne 0 ] && [ "$lanes" -gt 1 ]; then
	for name in "${names[@]}"; do
		log=.build/test-$name.log
		digest=$(awk '
			/^[[:space:]]*--- FAIL/ { print; under = 12; next }
			under > 0 && /^[[:space:]]+[^[:space:]-]/ { print; under--; next }
			{ under = 0 }
			/^panic:|^FAIL[[:space:]]|^make(\[[0-9]+\])?: \*\*\*|test timed out|^E +[A-Za-z]|^FAILED / { print }
		' "$log" | cut -c1-240 | head -80)
		[ -n "$digest" ] || continue
		echo
		echo "what failed, from $log:"
		echo "$digest" | sed 's/^/  /'
	done
fi

echo
echo "make test: the parts, in wall-clock seconds, and the CPU seconds its processes used (those reaped in it)"
while read -r part secs cpu result; do
	printf '  %-18s %5d s  %dm%02ds  %5d CPU s  %s\n' "$part" "$secs" $((secs / 60)) $((secs % 60)) "$cpu" "$result"
done <"$times"
total=$(($(date +%s) - start))
printf '  %-18s %5d s  %dm%02ds  %9s  %s\n' total "$total" $((total / 60)) $((total % 60)) "" "$([ $status -eq 0 ] && echo ok || echo FAILED)"
cores=$(nproc)
echo "  the CPUs were busy $(($(busy) - busy0)) s of the $((total * cores)) s that $cores cores had in that time (the whole machine, from /proc/stat)"
exit $status

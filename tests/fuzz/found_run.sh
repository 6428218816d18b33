#!/bin/sh
# tests/fuzz/found_run.sh FUSEC DIR: every failure the whole-pipeline fuzzer
# found and minimized (DIR/*.trace) passes `fusec run --check` again, with
# the seed and the binding its header records, on cpu and on emu. A case
# that still fails lives in tests/fuzz/open/ until its fix lands.
set -u
fusec=$1
dir=$2
fails=0
n=0
for f in "$dir"/*.trace; do
	# the header's second line: "# fusec run FILE --check ... --seed S --bind ..."
	args=$(sed -n 's/^# fusec run FILE //p' "$f" | head -n 1 | sed 's/ *(.*$//')
	seed=$(printf '%s\n' "$args" | sed -n 's/.*--seed \([0-9]*\).*/\1/p')
	bind=$(printf '%s\n' "$args" | sed -n 's/.*--bind \([^ ]*\).*/\1/p')
	for dev in cpu emu; do
		n=$((n + 1))
		set -- run "$f" --check --no-cache --device "$dev"
		[ -n "$seed" ] && set -- "$@" --seed "$seed"
		[ -n "$bind" ] && set -- "$@" --bind "$bind"
		if ! out=$("$fusec" "$@" 2>&1); then
			echo "FAIL: fusec $*"
			printf '%s\n' "$out" | tail -n 3
			fails=$((fails + 1))
		fi
	done
done
echo "$((n - fails)) passed, $fails failed"
[ "$fails" = 0 ]

#!/bin/sh
# cache_run.sh: the structural cache through the tools, end to end.
#
#     sh tests/cache_run.sh FUSEC FUSEC_CACHE SOURCE_DIR WORK_DIR
#
# Each case starts from an empty cache directory and reads the counters of
# the --json output:
#   - `fusec compile --target host`, then `fusec run --device cpu` on the
#     same trace compiles 0 kernels (it links the cached objects);
#   - a 2-layer and a 32-layer Llama share their keys: after the 2-layer
#     run, the 32-layer run compiles 0;
#   - a renamed and reordered copy (tools/gen/shuffle.py) compiles 0 after
#     the original, with `compile` and with `run`;
#   - a flipped byte in a cached object is a miss: the entry is removed
#     with a warning, compiled again, the run passes --check, and
#     `fusec-cache verify` is clean afterwards;
#   - --no-cache compiles every key and leaves the cache alone;
#   - a second `fusec compile` loads the program from the cache
#     (plan_cache_hits 1), its phases are reported; a damaged program
#     entry is a miss, removed with a warning, planned and stored again;
#     --no-plan-cache plans afresh;
#   - a FIFO as the stats file hangs neither run nor stat; verify reports it;
#   - on a read-only cache, clear and prune fail saying why, and compile
#     fails (stored false) when it cannot store what it compiled;
#   - fusec run's usage errors: --iters past the cap, malformed --bind.
# Timings are not asserted here; tools/bench and the README report them.
set -eu
fusec=$1
fcache=$2
src=$3
work=$4
rm -rf "$work"
mkdir -p "$work"
bind="--bind B=2,T=16"
fails=0

gen() {
	python3 "$src/tools/gen/llama.py" --layers "$1" --hidden 256 --heads 4 \
		--intermediate 688 --vocab 512 -o "$work/l$1.trace"
}
# field NAME JSON: the integer value of "NAME" in a one-line JSON object
field() {
	printf '%s\n' "$2" | sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p"
}
expect() { # what got want context
	if [ "$2" != "$3" ]; then
		echo "FAIL: $4: $1 is '$2', want '$3'"
		fails=$((fails + 1))
	else
		echo "ok: $4: $1 = $2"
	fi
}
fresh() {
	FUSEC_CACHE_DIR="$work/cache-$1"
	export FUSEC_CACHE_DIR
}

gen 2
gen 32
python3 "$src/tools/gen/shuffle.py" "$work/l2.trace" --seed 7 -o "$work/l2s.trace"
"$fusec" check "$work/l2s.trace"

# compile, then run: nothing compiled by the run
fresh compile-run
j=$("$fusec" compile --target host "$work/l2.trace" --json)
expect compiled "$(field compiled "$j")" "$(field unique "$j")" "compile --target host"
j=$("$fusec" run "$work/l2.trace" --device cpu $bind --check --json)
expect compiled "$(field compiled "$j")" 0 "run after compile"
expect cache_hits "$(field cache_hits "$j")" "$(field unique "$j")" "run after compile"
case $j in *'"ok": true'*) ;; *) echo "FAIL: run after compile: $j"; fails=$((fails + 1));; esac

# 2 layers, then 32: the same keys
fresh layers
j=$("$fusec" run "$work/l2.trace" --device cpu $bind --json)
u2=$(field unique "$j")
expect compiled "$(field compiled "$j")" "$u2" "2-layer cold run"
j=$("$fusec" run "$work/l32.trace" --device cpu $bind --json)
expect unique "$(field unique "$j")" "$u2" "32-layer run"
expect compiled "$(field compiled "$j")" 0 "32-layer run after 2-layer"

# renamed and reordered: compile, and run
fresh shuffle-compile
"$fusec" compile --target host "$work/l2.trace" --json >/dev/null
j=$("$fusec" compile --target host "$work/l2s.trace" --json)
expect compiled "$(field compiled "$j")" 0 "compile of the shuffled copy"
fresh shuffle-run
"$fusec" run "$work/l2.trace" --device cpu $bind --json >/dev/null
j=$("$fusec" run "$work/l2s.trace" --device cpu $bind --check --json)
expect compiled "$(field compiled "$j")" 0 "run of the shuffled copy"
case $j in *'"ok": true'*) ;; *) echo "FAIL: shuffled run: $j"; fails=$((fails + 1));; esac

# a damaged object: a miss, removed, compiled again, still correct
fresh damage
"$fusec" run "$work/l2.trace" --device cpu $bind --json >/dev/null
python3 - $(find "$FUSEC_CACHE_DIR" -name '*.fzc' | sort) <<'PY'
import sys
# the first kernel entry (the cache also keeps the program and its keys)
for p in sys.argv[1:]:
    b = bytearray(open(p, "rb").read())
    if b.find(b"obj\0") >= 0:
        at = b.index(b"obj\0") + 24 + 100   # inside the object's bytes
        b[at] ^= 0x5a
        open(p, "wb").write(bytes(b))
        break
else:
    sys.exit("no kernel entry in the cache")
PY
j=$("$fusec" run "$work/l2.trace" --device cpu $bind --check --json 2>"$work/damage.err")
expect compiled "$(field compiled "$j")" 1 "run after a flipped byte"
case $j in *'"ok": true'*) ;; *) echo "FAIL: damaged run: $j"; fails=$((fails + 1));; esac
if grep -q "damaged and was removed" "$work/damage.err"; then
	echo "ok: the damaged entry was reported"
else
	echo "FAIL: no warning about the damaged entry:"; cat "$work/damage.err"
	fails=$((fails + 1))
fi
if "$fcache" verify >"$work/verify.out"; then
	echo "ok: fusec-cache verify is clean"
else
	echo "FAIL: verify:"; cat "$work/verify.out"; fails=$((fails + 1))
fi

# --no-cache: compiles every key, writes nothing
fresh none
j=$("$fusec" run "$work/l2.trace" --device cpu $bind --no-cache --json)
expect compiled "$(field compiled "$j")" "$(field unique "$j")" "--no-cache"
n=$(find "$FUSEC_CACHE_DIR" -name '*.fzc' 2>/dev/null | wc -l)
expect entries "$n" 0 "--no-cache"

# programs in the cache
fresh plan
j=$("$fusec" compile --target host "$work/l32.trace" --json)
expect plan_cache_hits "$(field plan_cache_hits "$j")" 0 "first compile"
j=$("$fusec" compile --target host "$work/l32.trace" --json)
expect plan_cache_hits "$(field plan_cache_hits "$j")" 1 "second compile"
expect compiled "$(field compiled "$j")" 0 "second compile"
for ph in parse plan kernels llvm ptx cubin store; do
	case $j in *"\"$ph\": "[0-9]*) ;;
	*) echo "FAIL: no phase $ph in $j"; fails=$((fails + 1));; esac
done
python3 - $(find "$FUSEC_CACHE_DIR" -name '*.fzc') <<'PY'
import sys
# the program's entry (its form starts "plan"; the kernel keys' entry holds
# the program's form too, after its own header)
for p in sys.argv[1:]:
    b = bytearray(open(p, "rb").read())
    if b[64:80] == b"plan\ntarget plan":
        b[len(b) // 2] ^= 0x5a         # inside the program's payload
        open(p, "wb").write(bytes(b))
        break
else:
    sys.exit("no program entry in the cache")
PY
j=$("$fusec" compile --target host "$work/l32.trace" --json 2>"$work/plan.err")
expect plan_cache_hits "$(field plan_cache_hits "$j")" 0 "compile after a flipped byte"
expect compiled "$(field compiled "$j")" 0 "compile after a flipped byte"
if grep -q "damaged and was removed" "$work/plan.err"; then
	echo "ok: the damaged program entry was reported"
else
	echo "FAIL: no warning about the damaged program:"; cat "$work/plan.err"
	fails=$((fails + 1))
fi
j=$("$fusec" compile --target host "$work/l32.trace" --json)
expect plan_cache_hits "$(field plan_cache_hits "$j")" 1 "compile after the repair"
j=$("$fusec" compile --target host "$work/l32.trace" --no-plan-cache --json)
expect plan_cache_hits "$(field plan_cache_hits "$j")" 0 "--no-plan-cache"

# a FIFO as the stats file: run and stat finish (they hung, holding the
# lock), and verify reports it
fresh fifo
"$fusec" run "$work/l2.trace" --device cpu $bind >/dev/null 2>&1
rm -f "$FUSEC_CACHE_DIR/v1/stats"
mkfifo "$FUSEC_CACHE_DIR/v1/stats"
if timeout 60 "$fcache" stat >/dev/null 2>&1; then
	echo "ok: stat with a FIFO as the stats file"
else
	echo "FAIL: stat with a FIFO as the stats file (status $?)"; fails=$((fails + 1))
fi
out=$(timeout 60 "$fcache" verify 2>&1) && rc=0 || rc=$?
case "$rc $out" in
	"1 "*"stats: not a regular file"*) echo "ok: verify reports the FIFO" ;;
	*) echo "FAIL: verify with a FIFO: $rc $out"; fails=$((fails + 1)) ;;
esac
if timeout 60 "$fusec" run "$work/l2.trace" --device cpu --bind B=3,T=5 >/dev/null 2>&1; then
	echo "ok: run with a FIFO as the stats file"
else
	echo "FAIL: run with a FIFO as the stats file (status $?)"; fails=$((fails + 1))
fi

# a read-only cache: clear and prune fail and say why; compile fails when
# what it compiled cannot be stored, not when everything was a hit. Root
# writes through permission bits, so as root the tools run as nobody
# (setpriv), on a cache that nobody owns.
ro=$work/ro
mkdir -p "$ro"
as=""
if [ "$(id -u)" = 0 ]; then
	if command -v setpriv >/dev/null 2>&1; then
		chown 65534:65534 "$ro"
		as="setpriv --reuid=65534 --regid=65534 --clear-groups"
	else
		as=skip
	fi
fi
if [ "$as" = skip ]; then
	echo "skipped: the read-only cache cases (root without setpriv)"
else
	FUSEC_CACHE_DIR=$ro/c
	$as "$fusec" compile --target host "$work/l2.trace" >/dev/null
	chmod -R a-w "$FUSEC_CACHE_DIR"
	for c in clear "prune --max-size 0"; do
		out=$($as "$fcache" $c 2>&1) && rc=0 || rc=$?
		case "$rc $out" in
			"1 "*"cannot remove"*"entries from"*) echo "ok: $c on a read-only cache" ;;
			*) echo "FAIL: $c on a read-only cache: $rc $out"; fails=$((fails + 1)) ;;
		esac
	done
	out=$($as "$fusec" compile --target host "$work/l2.trace" 2>&1) && rc=0 || rc=$?
	expect "status of compile, all hits, read-only" "$rc" 0 "read-only cache"
	out=$($as "$fusec" compile --target host "$src/tests/traces/rotary.trace" --json \
		2>"$work/ro.err") && rc=0 || rc=$?
	expect "status of compile, new keys, read-only" "$rc" 1 "read-only cache"
	case "$out" in *'"stored": false'*) echo "ok: --json says stored false" ;;
		*) echo "FAIL: compile --json on a read-only cache: $out"; fails=$((fails + 1));; esac
	if grep -q "could not be stored" "$work/ro.err"; then
		echo "ok: compile says what could not be stored"
	else
		echo "FAIL: compile on a read-only cache:"; cat "$work/ro.err"; fails=$((fails + 1))
	fi
	chmod -R u+w "$FUSEC_CACHE_DIR"
fi

# fusec run's usage errors (exit 2, each with its own message)
usage() { # expected-message args...
	want=$1
	shift
	out=$("$fusec" run "$work/l2.trace" "$@" 2>&1 >/dev/null) && rc=0 || rc=$?
	case "$rc $out" in
		"2 fusec run: "*"$want"*) echo "ok: run $* is refused" ;;
		*) echo "FAIL: run $*: status $rc: $out"; fails=$((fails + 1)) ;;
	esac
}
usage "at most 10000000 runs" --iters 9223372036854775807
usage "an empty entry" --bind B=3,,T=2
usage "is given twice" --bind B=3 --bind T=2
usage "'B' is bound twice" --bind B=3,B=4
usage "must be a decimal number" --bind B=+3
usage "is not a symbol name" --bind "T-1=2"

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all cache_run cases passed"

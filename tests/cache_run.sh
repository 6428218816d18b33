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
#     --no-plan-cache plans afresh.
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

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all cache_run cases passed"

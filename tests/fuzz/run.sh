#!/bin/sh
# run.sh SECONDS: build the parser's libFuzzer target and fuzz it.
#
#   tests/fuzz/run.sh 120
#
# Builds fuzz_parse.c with the library sources (frontend/*.c, ir/*.c) using
# clang-19 when installed, else clang, with -fsanitize=fuzzer,address,
# undefined -g -O1, then runs it for SECONDS on a corpus seeded from
# tests/traces/*.trace, with a dictionary of the format's tokens. Work goes
# to $FUZZ_DIR (default build/fuzz): the binary, the growing corpus, the log
# and any crash-* artifact. Prints the number of executions at the end;
# exits non-zero when the fuzzer found a crash.
set -eu

secs=${1:-60}
case "$secs" in
	''|*[!0-9]*) echo "usage: $0 SECONDS" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${FUZZ_DIR:-$root/build/fuzz}

if command -v clang-19 >/dev/null 2>&1; then
	cc=clang-19
elif command -v clang >/dev/null 2>&1; then
	cc=clang
else
	echo "run.sh: no clang found (apt-get install clang-19)" >&2
	exit 2
fi

mkdir -p "$out/corpus"
cp "$root"/tests/traces/*.trace "$out/corpus/"

echo "== building $out/fuzz_parse with $cc"
# The library sources go into an archive, so the link pulls in only what
# the parser reaches (a pass still being written elsewhere cannot break it).
flags="-std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
rm -rf "$out/obj"
mkdir -p "$out/obj"
for src in "$root"/frontend/*.c "$root"/ir/*.c; do
	obj="$out/obj/$(basename "$(dirname "$src")")_$(basename "$src" .c).o"
	$cc $flags -I"$root/frontend" -I"$root/ir" -c "$src" -o "$obj"
done
rm -f "$out/libfusec_fuzz.a"
ar rcs "$out/libfusec_fuzz.a" "$out"/obj/*.o
$cc -std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	-I"$root/frontend" -I"$root/ir" "$here/fuzz_parse.c" \
	"$out/libfusec_fuzz.a" -lm -o "$out/fuzz_parse"

echo "== fuzzing for $secs s"
status=0
(cd "$out" && ./fuzz_parse -max_total_time="$secs" -max_len=8192 \
	-timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
	-dict="$here/trace.dict" -artifact_prefix="$out/" corpus) \
	>"$out/log" 2>&1 || status=$?
grep -E '^(#[0-9]+ .*(DONE|pulse)|Done|stat::|==[0-9]+==ERROR|SUMMARY|artifact_prefix)' \
	"$out/log" | tail -n 12

execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log" | tail -n 1)
echo "== executions: ${execs:-unknown} in $secs s" \
     "($(( ${execs:-0} / (secs > 0 ? secs : 1) )) per second)"
if [ "$status" != 0 ]; then
	echo "== the fuzzer stopped with status $status; see $out/log" >&2
	exit 1
fi

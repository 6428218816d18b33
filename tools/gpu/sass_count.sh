#!/bin/sh
# sass_count.sh TRACE...: what ptxas makes of each kernel region, without
# a GPU: registers, SASS instructions (static), and the most frequent
# opcodes, one line a region.
#
#     tools/gpu/sass_count.sh [--bind B=8,T=512] [--sm sm_90] TRACE...
#
# fusec emit --ptx writes each region's PTX, the toolkit's ptxas compiles
# it, and cuobjdump -sass lists the machine code. cuobjdump is not in the
# Debian CUDA packages this machine has; PyPI has it:
#
#     pip download --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm \
#         -d /tmp/w && for w in /tmp/w/*.whl; do
#         python3 -m zipfile -e $w /tmp/w/x; done
#
# then CUOBJDUMP=/tmp/w/x/nvidia/cu13/bin/cuobjdump, and that folder on
# PATH (cuobjdump -sass runs nvdisasm; chmod +x both). The
# counts are static: a loop body counts once, a slow path never taken
# counts in full; read the listing (kept under $KEEP, default a temporary
# folder) for the path that runs.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
fusec=${FUSEC:-$root/build/tools/fusec}
ptxas=${PTXAS:-/usr/local/cuda/bin/ptxas}
cuobjdump=${CUOBJDUMP:-cuobjdump}
sm=sm_90
bind=
while [ $# -gt 0 ]; do
	case $1 in
	--sm) sm=$2; shift 2 ;;
	--bind) bind="--bind $2"; shift 2 ;;
	-h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) break ;;
	esac
done
[ $# -gt 0 ] || { echo "usage: sass_count.sh [--bind LIST] [--sm sm_NN] TRACE..." >&2; exit 2; }
command -v "$cuobjdump" >/dev/null 2>&1 || [ -x "$cuobjdump" ] ||
	{ echo "sass_count.sh: no cuobjdump (set CUOBJDUMP; see --help)" >&2; exit 2; }
keep=${KEEP:-$(mktemp -d)}
for t in "$@"; do
	n=$(basename "$t" .trace)
	d=$keep/$n
	mkdir -p "$d"
	# shellcheck disable=SC2086
	"$fusec" emit "$t" --ptx --target "$sm" $bind --out-dir "$d" >/dev/null 2>"$d/emit.err" ||
		{ cat "$d/emit.err" >&2; exit 1; }
	for p in "$d"/*.ptx; do
		b=${p%.ptx}
		"$ptxas" -arch="$sm" -v "$p" -o "$b.cubin" 2>"$b.ptxas"
		"$cuobjdump" -sass "$b.cubin" >"$b.sass"
		regs=$(grep -o 'Used [0-9]* registers' "$b.ptxas" | awk '{s += $2} END {print s}')
		grep -E '^ +/\*[0-9a-f]{4}\*/' "$b.sass" |
			sed -E 's/^ +\/\*[0-9a-f]+\*\/ +//; s/^@!?U?P[0-9T] +//' | awk '{print $1}' |
			sort | uniq -c | sort -rn |
			awk -v n="$n" -v r="$(basename "$b")" -v regs="$regs" \
				'{ tot += $1; if (NR <= 8) top = top sprintf(" %s:%d", $2, $1) }
				 END { printf "%s %s: %s registers, %d instructions;%s\n", n, r, regs, tot, top }'
	done
done
[ -n "${KEEP:-}" ] || rm -rf "$keep"

#!/bin/sh
# setup.sh: install what is missing, build, and (with --test) run the tests.
#
#   ./setup.sh                 apt packages, then configure and build in build/
#   ./setup.sh --test          also torch + transformers in .venv, the fusec
#                              package installed there (editable, from the
#                              build in build/), then ctest
#   ./setup.sh --sanitize ...  the same in build-asan/ with ASan and UBSan
#
# Idempotent: packages already installed are not installed again, the venv
# is reused, and the build is incremental. Needs root (or sudo) only when an
# apt package is missing.
set -eu
cd "$(dirname "$0")"

test_suite=0
sanitize=0
for arg in "$@"; do
	case "$arg" in
	--test) test_suite=1 ;;
	--sanitize) sanitize=1 ;;
	-h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "setup.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
	esac
done

t0=$(date +%s)
say() { printf '== %s (%s s in)\n' "$*" "$(( $(date +%s) - t0 ))"; }

# ---- packages ----
# libopenblas0-pthread: the CPU target's matrix products (opened at run
# time: runtime/blas.c; without it they run a plain loop)
pkgs="build-essential cmake pkg-config llvm-19-dev libzstd-dev zlib1g-dev libxml2-dev check libxxhash-dev python3 libopenblas0-pthread"
[ "$test_suite" = 1 ] && pkgs="$pkgs python3-venv"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
		missing="$missing $p"
done
if [ -n "$missing" ]; then
	say "installing:$missing"
	sudo=""
	[ "$(id -u)" = 0 ] || sudo="sudo"
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	# shellcheck disable=SC2086
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
fi

# ---- python for the PyTorch bridge tests ----
python=""
if [ "$test_suite" = 1 ]; then
	if [ ! -x .venv/bin/python ]; then
		say "creating .venv"
		python3 -m venv .venv
	fi
	if ! .venv/bin/python -c "import torch, transformers, scikit_build_core" 2>/dev/null; then
		# torch with its CUDA libraries is 5.7 GB installed, and pip
		# unpacks each wheel beside it: say so plainly rather than fail
		# half-way with ENOSPC and a half-filled venv
		need_kb=$((9 * 1024 * 1024))
		free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
		if [ "$free_kb" -lt "$need_kb" ]; then
			echo "setup.sh: torch and transformers need about 9 GB free here;" \
				"$(pwd) has $((free_kb / 1024)) MB" >&2
			exit 1
		fi
		say "installing torch and transformers into .venv (large; once)"
		.venv/bin/python -m pip install -q --no-cache-dir --upgrade pip
		# a dropped connection mid-wheel (torch's are hundreds of MB)
		# resumes rather than failing the setup (pip >= 25.1, just
		# installed); no cache, which would hold every wheel a second time
		.venv/bin/python -m pip install -q --no-cache-dir --resume-retries 20 \
			torch transformers scikit-build-core
	fi
	python="$(pwd)/.venv/bin/python"
fi

# ---- build ----
jobs=$(nproc 2>/dev/null || echo 2)
if [ "$sanitize" = 1 ]; then
	dir=build-asan
	# -O1, as ASan's documentation advises for speed (its ctest: 351 s
	# here against 447 at -O0); Debug keeps the assertions; no benchmarks
	# (no test runs them, and each links LLVM)
	set -- -DCMAKE_BUILD_TYPE=Debug -DFUSEC_BENCH=OFF \
		"-DCMAKE_C_FLAGS=-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
else
	dir=build
	set -- -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
[ -n "$python" ] && set -- "$@" "-DFUSEC_PYTHON=$python"
say "building in $dir/"
cmake -S . -B "$dir" "$@" >/dev/null
cmake --build "$dir" -j "$jobs"

# The Python package into .venv, editable (its Python files are the source
# tree's, its library build/libfusec.so, so a rebuild needs no reinstall):
# scikit-build-core reconfigures $dir with the same settings, so its build
# finds nothing to do. The sanitized library is not for the venv: there the
# tests name it in FUSEC_LIBRARY, with the package from the normal build, or
# from the source tree where none is installed.
if [ "$test_suite" = 1 ] && [ "$sanitize" = 0 ]; then
	say "installing the fusec package into .venv (editable)"
	CMAKE_GENERATOR="Unix Makefiles" .venv/bin/python -m pip install -q \
		--no-build-isolation --no-deps --editable . \
		-Cbuild-dir="$dir" -Ccmake.build-type=RelWithDebInfo \
		-Ccmake.define.FUSEC_TOOLS=ON -Ccmake.define.BUILD_TESTING=ON \
		"-Ccmake.define.FUSEC_PYTHON=$python"
fi

if [ "$test_suite" = 1 ]; then
	say "testing"
	ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
		ctest --test-dir "$dir" --output-on-failure -j "$jobs"
fi

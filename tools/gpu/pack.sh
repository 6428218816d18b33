#!/bin/sh
# pack.sh: build what a GPU run needs and pack it into one archive.
#
#     tools/gpu/pack.sh [ARCHIVE]        (default: gpu-pack/fusec-gpu.tar.xz)
#
# The GPU machine has no LLVM and no compiler time to spare: what runs
# there is built here. pack.sh configures its own build folder
# ($PACK_BUILD, default build-gpu/) with LLVM linked statically, builds
# the binaries tools/gpu/run.sh needs (fusec, fusec-cache, bench_cuda,
# test_cuda, and test_cpu and test_codegen for its CPU, which is often an
# AVX-512 one where CI's are not) and libfusec.so (for the Python checks),
# strips
# them and packs them into ONE xz archive: each carries its own copy of
# LLVM (about 45 MB stripped), and in one xz stream with a dictionary that
# spans a whole binary those copies compress against each other (190 MB
# of binaries become under 20 MiB).
#
# What the machine may lack travels too. The binaries are linked with
#   - tools/gpu/glibc_compat.c: Debian's static LLVM calls arc4random,
#     which exists from glibc 2.36 on; our own, hidden definition takes
#     its place;
#   - libstdc++ and libgcc statically (LLVM is C++), so neither the
#     machine's libstdc++ version nor the one PyTorch loaded matters (GCC
#     12's unwinder calls _dl_find_object, glibc 2.35, static or not);
#   so the newest glibc symbol needed is 2.35's, checked below against
#   GLIBC_MAX (default 2.35: Ubuntu 22.04, the oldest of CUDA 13's Ubuntu
#   images; the GPU machine's Python 3.12.3 is Ubuntu 24.04's, glibc 2.39);
#   - --as-needed, so libraries nothing calls are not asked for;
# and every other shared library they load (ldd: libz, libzstd, libxxhash,
# libsubunit for test_cuda) is copied into deps/; run.sh puts deps/ on the
# loader path only for the ones the machine lacks.
#
# The archive holds fusec-gpu/{bin,lib,deps}/ and fusec-gpu/pack.json: the
# commit built (and whether the tree was dirty), the date, the newest
# glibc version needed, and each file's size. Its folder gpu-pack/ is
# git-ignored and is what the device tool's `carry` names (README.md).
#
# Environment: PACK_BUILD (build folder), JOBS (parallel compiles,
# default nproc), GLIBC_MAX, CC.
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/gpu-pack/fusec-gpu.tar.xz}
build=${PACK_BUILD:-$repo/build-gpu}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
glibc_max=${GLIBC_MAX:-2.35}
cc=${CC:-cc}
case "$out" in /*) ;; *) out=$(pwd)/$out ;; esac

say() { printf '== pack: %s\n' "$*"; }

# ---- build ----------------------------------------------------------------
mkdir -p "$build/pack-link"
"$cc" -O2 -fPIC -c "$repo/tools/gpu/glibc_compat.c" -o "$build/pack-link/glibc_compat.o"
# a folder holding only libstdc++.a, searched first: LLVM's `-lstdc++`
# then finds the static library
ln -sf "$("$cc" -print-file-name=libstdc++.a)" "$build/pack-link/libstdc++.a"
link="-L$build/pack-link -static-libgcc -Wl,--as-needed $build/pack-link/glibc_compat.o"
launcher=
command -v ccache >/dev/null 2>&1 && launcher=-DCMAKE_C_COMPILER_LAUNCHER=ccache
say "configuring $build (static LLVM)"
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DFUSEC_LLVM_STATIC=ON -DBUILD_TESTING=ON $launcher \
	"-DCMAKE_EXE_LINKER_FLAGS=$link" "-DCMAKE_SHARED_LINKER_FLAGS=$link" >/dev/null
say "building with $jobs jobs"
cmake --build "$build" -j "$jobs" --target fusec_tool fusec_cache_tool \
	bench_cuda test_cuda test_cpu test_codegen fusec

# ---- stage ----------------------------------------------------------------
stage="$build/pack-stage/fusec-gpu"
rm -rf "$build/pack-stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/deps"
for b in tools/fusec tools/fusec-cache tools/bench/bench_cuda tests/test_cuda \
	tests/test_cpu tests/test_codegen; do
	strip --strip-unneeded -o "$stage/bin/$(basename "$b")" "$build/$b"
done
strip --strip-unneeded -o "$stage/lib/libfusec.so" "$build/libfusec.so"

# the shared libraries they load, glibc's own and the loader's aside
for f in "$stage"/bin/* "$stage"/lib/*; do ldd "$f"; done |
	awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
	while read -r soname path; do
		case "$soname" in
		libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*) continue ;;
		esac
		cp -L "$path" "$stage/deps/$soname"
	done

# the newest glibc symbol version anything packed asks for
need=$(for f in "$stage"/bin/* "$stage"/lib/* "$stage"/deps/*; do objdump -T "$f"; done |
	grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
cxx=$(for f in "$stage"/bin/* "$stage"/lib/*; do objdump -T "$f"; done |
	grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1 || true)
newest=$(printf '%s\n%s\n' "$need" "$glibc_max" | sort -V | tail -1)
if [ "$newest" != "$glibc_max" ]; then
	say "the packed files need glibc $need, newer than GLIBC_MAX=$glibc_max:"
	for f in "$stage"/bin/* "$stage"/lib/* "$stage"/deps/*; do
		objdump -T "$f" | grep "GLIBC_$need" | sed "s|^|    $(basename "$f"): |"
	done
	exit 1
fi
[ -z "$cxx" ] || say "warning: libstdc++ is linked dynamically ($cxx needed)"

commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
dirty=false
[ -z "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=true
{
	printf '{\n  "commit": "%s",\n  "dirty": %s,\n' "$commit" "$dirty"
	printf '  "date": "%s",\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	printf '  "built_on_glibc": "%s",\n' "$(getconf GNU_LIBC_VERSION | sed 's/glibc //')"
	printf '  "glibc_needed": "%s",\n  "files": {\n' "$need"
	(cd "$stage" && for f in bin/* lib/* deps/*; do
		printf '    "%s": %s\n' "$f" "$(wc -c <"$f")"
	done) | sed '$!s/$/,/'
	printf '  }\n}\n'
} >"$stage/pack.json"

# ---- archive ----------------------------------------------------------------
# one stream, single-threaded (threads would split it into blocks that
# cannot see each other's LLVM), a dictionary larger than any one binary
mkdir -p "$(dirname "$out")"
say "compressing $(du -sh "$stage" | cut -f1) of files"
tar -C "$build/pack-stage" -cf - fusec-gpu |
	xz -T1 --lzma2=preset=9e,dict=128MiB >"$out.tmp"
mv "$out.tmp" "$out"
size=$(wc -c <"$out")
say "$out: $(awk "BEGIN { printf \"%.1f\", $size / 1048576 }") MiB," \
	"commit $(printf '%.12s' "$commit")$( [ "$dirty" = true ] && echo ' (dirty)'), glibc >= $need"
if [ "$size" -gt $((40 * 1048576)) ]; then
	say "larger than 40 MiB: it and the repository must travel in 64 MiB"
	exit 1
fi

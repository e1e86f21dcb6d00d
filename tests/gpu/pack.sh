#!/usr/bin/env bash
# Builds here, where the build dependencies are installed, what the GPU check
# (tests/gpu/run.sh) runs on the lent GPU machine, which has a compiler, CMake
# and CUDA but none of our Debian packages and cannot install any. Writes
# .gpu-bundle/ at the repository root (ignored by git; the device tool's
# `carry: [".gpu-bundle"]` takes it along):
#
#   .gpu-bundle/bundle.tar.xz   paradev-gpu-bundle/
#                                 bin/       the executables (Release, sm_90
#                                            SASS + compute_90 PTX, CUDA
#                                            runtime linked statically)
#                                 lib/       their shared-library closure from
#                                            ldd, less glibc, libstdc++/libgcc_s
#                                            and the CUDA and driver libraries;
#                                            plus libcmocka.so/libopenblas.so/
#                                            libjson-c.so
#                                            links for an engine-only build
#                                 lib-compat/ libstdc++ and libgcc_s from here,
#                                            used only where the machine's are
#                                            missing or too old
#                                 include/   cmocka.h, cblas.h, openblas_config.h,
#                                            json-c/
#                                 data/      digits.csv.gz (train_digits)
#                                 MANIFEST, sources.sha256
#   .gpu-bundle/MANIFEST        the same manifest, readable without unpacking
#
# MANIFEST lines: `bin NAME`, `lib NAME FROM`, `machine NAME` (a library the
# GPU machine must provide: CUDA, cuBLAS, NCCL, driver), `compat NAME FROM`,
# `built ...`. sources.sha256 lets run.sh say whether the tree it runs in is
# the one the bundle was built from.
#
# Usage: tests/gpu/pack.sh [BUILDDIR]        (default build-gpu-pack)
#   JOBS=N   parallel build jobs (default: all cores)
# Exit status 0 with the bundle written and its size printed; 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
build=${1:-build-gpu-pack}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
out="$root/.gpu-bundle"
limit_mib=50
start=$(date +%s)

say() { printf '== %s\n' "$*"; }
die() {
  echo "pack: $*" >&2
  exit 1
}

# --- configure and build --------------------------------------------------------
gen=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
  gen=(-G Ninja)
fi
say "configure $build (Release, PARADEV_CUDA=ON, sm_90 + PTX, static CUDA runtime)"
# No build RPATH: on the GPU machine run.sh points LD_LIBRARY_PATH at the
# bundle's lib/ and at the machine's CUDA libraries, and nothing else.
mkdir -p "$build"
if ! cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DPARADEV_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DPARADEV_CUDART_STATIC=ON -DPARADEV_ENGINE_ONLY=OFF \
  -DCMAKE_SKIP_BUILD_RPATH=ON >"$build/pack-configure.log" 2>&1; then
  tail -30 "$build/pack-configure.log" >&2
  die "configure failed (log: $build/pack-configure.log)"
fi
grep "paradev: CUDA" "$build/pack-configure.log" | sed 's/^-- /   /'
grep -q "paradev: CUDA backend ON" "$build/pack-configure.log" || die "the CUDA backend is off"

targets=(test_gpu_backend test_gpu_ops test_gpu_placement bench_gpu paradevd paradev train_digits)
# Whether the generated build system knows a target (Ninja or Makefiles).
has_target() {
  if [ -f "$build/build.ninja" ]; then
    grep -q "^build $1: " "$build/build.ninja"
  else
    grep -q "^$1:" "$build/Makefile"
  fi
}
if has_target bench_gpu_rpc; then
  targets+=(bench_gpu_rpc)
else
  echo "   bench_gpu_rpc: no such target in this tree; the bundle goes without it"
fi
say "build ${targets[*]} (-j$jobs)"
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$build/pack-build.log" 2>&1; then
  grep -E -A3 "error|FAILED" "$build/pack-build.log" | head -40 >&2
  die "build failed (log: $build/pack-build.log)"
fi

# --- stage ------------------------------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/paradev-pack.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
stage="$tmp/paradev-gpu-bundle"
mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-compat" "$stage/include" "$stage/data"
manifest="$stage/MANIFEST"
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$( (git status --porcelain --untracked-files=no 2>/dev/null || true) | wc -l)
nvcc_v=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")$/\1/p' \
  "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1 || true)
os=$( (. /etc/os-release && echo "$ID-$VERSION_ID") 2>/dev/null || echo unknown)
{
  echo "# paradev GPU bundle: written by tests/gpu/pack.sh, read by tests/gpu/run.sh"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $os, glibc $(getconf GNU_LIBC_VERSION |
    awk '{print $2}'), nvcc ${nvcc_v:-?}, from $rev with $dirty modified tracked files"
} >"$manifest"

# The directories of the shared libraries built here (libparadev.so.0), for ldd.
build_libdirs=$(find "$build" -name 'lib*.so*' -not -path '*/CMakeFiles/*' \
  -printf '%h\n' 2>/dev/null | sort -u | paste -sd: -)

# Libraries never bundled: glibc's, and those the GPU machine must provide.
is_glibc() {
  case $1 in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | \
      librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libmvec.so.* | \
      libnss_*.so.* | libthread_db.so.*) return 0 ;;
  esac
  return 1
}
is_machine() {
  case $1 in
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.* | \
      libnvidia*.so* | libnvrtc*.so.* | libnvJitLink.so.* | libcufft*.so.* | libcurand.so.* | \
      libcusparse.so.* | libcusolver*.so.* | libcudnn*.so.*) return 0 ;;
  esac
  return 1
}

declare -A seen=()
for t in "${targets[@]}"; do
  exe=$(find "$build" -type f -name "$t" -perm -u+x -not -path '*/CMakeFiles/*' -print -quit)
  [ -n "$exe" ] || die "built $t but cannot find its executable under $build"
  cp "$exe" "$stage/bin/$t"
  echo "bin $t" >>"$manifest"
  ldd_out=$(LD_LIBRARY_PATH="$build_libdirs" ldd "$exe") || die "ldd $exe failed"
  if grep -q "not found" <<<"$ldd_out"; then
    grep "not found" <<<"$ldd_out" >&2
    die "$t: libraries not found here"
  fi
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    if is_glibc "$name"; then
      continue
    elif is_machine "$name"; then
      echo "machine $name" >>"$manifest"
    elif [ "$name" = libstdc++.so.6 ] || [ "$name" = libgcc_s.so.1 ]; then
      cp -L "$path" "$stage/lib-compat/$name"
      echo "compat $name $(readlink -f "$path")" >>"$manifest"
    else
      cp -L "$path" "$stage/lib/$name"
      echo "lib $name $(readlink -f "$path")" >>"$manifest"
    fi
  done <<<"$ldd_out"
done
# cudart dlopens the driver: the machine must have it, ldd or not.
grep -q "^machine libcuda.so.1$" "$manifest" || echo "machine libcuda.so.1" >>"$manifest"

# --- what an engine-only build needs (run.sh's fallback) ---------------------
cache="$build/CMakeCache.txt"
cblas_dir=$(sed -n 's/^CBLAS_INCLUDE_DIR:PATH=//p' "$cache")
cblas_h=$(readlink -f "$cblas_dir/cblas.h")
cp -L "$cblas_h" "$stage/include/cblas.h"
cp -L "$(dirname "$cblas_h")/openblas_config.h" "$stage/include/openblas_config.h"
cmocka_inc=$(pkg-config --variable=includedir cmocka 2>/dev/null || true)
cp -L "${cmocka_inc:-/usr/include}/cmocka.h" "$stage/include/cmocka.h"
[ -f "$stage/lib/libcmocka.so.0" ] || die "libcmocka.so.0 is not in the closure"
[ -f "$stage/lib/libopenblas.so.0" ] || die "libopenblas.so.0 is not in the closure"
ln -s libcmocka.so.0 "$stage/lib/libcmocka.so"
ln -s libopenblas.so.0 "$stage/lib/libopenblas.so"
# json-c: bench/benchutil.c writes its JSON lines with it.
jsonc_inc=$(pkg-config --variable=includedir json-c 2>/dev/null || true)
cp -rL "${jsonc_inc:-/usr/include}/json-c" "$stage/include/json-c"
[ -f "$stage/lib/libjson-c.so.5" ] || die "libjson-c.so.5 is not in the closure"
ln -s libjson-c.so.5 "$stage/lib/libjson-c.so"
echo "dev include/cmocka.h include/cblas.h include/openblas_config.h lib/libcmocka.so" \
  "lib/libopenblas.so include/json-c lib/libjson-c.so" >>"$manifest"

cp examples/data/digits.csv.gz "$stage/data/digits.csv.gz"
echo "data digits.csv.gz" >>"$manifest"

# The sources the bundle was built from, so run.sh can tell a stale bundle.
srcs=(CMakeLists.txt cmake common device include proto scheduler server client examples
  bench tests/gpu tests/unit)
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -co --exclude-standard -- "${srcs[@]}"
else
  find "${srcs[@]}" -type f
fi | grep -v -E '\.md$|^tests/gpu/[^/]*\.sh$' |
  while read -r f; do if [ -f "$f" ]; then printf '%s\n' "$f"; fi; done |
  LC_ALL=C sort | xargs -d '\n' sha256sum >"$stage/sources.sha256"

# --- pack ---------------------------------------------------------------------
say "compress"
rm -rf "$out"
mkdir -p "$out"
tar -C "$tmp" -cf - paradev-gpu-bundle | xz -6 -T0 >"$out/bundle.tar.xz"
cp "$manifest" "$out/MANIFEST"
raw=$(du -sb "$stage" | cut -f1)
size=$(stat -c %s "$out/bundle.tar.xz")
echo "   executables: $(grep -c '^bin ' "$manifest"); bundled libraries: $(grep -c '^lib ' "$manifest");" \
  "from the GPU machine: $(grep '^machine ' "$manifest" | cut -d' ' -f2 | paste -sd' ' -)"
awk -v s="$size" -v r="$raw" -v t=$(($(date +%s) - start)) 'BEGIN {
  printf "   .gpu-bundle/bundle.tar.xz: %.1f MiB (%.1f MiB unpacked); pack.sh took %d s\n",
    s / 1048576, r / 1048576, t }'
if [ "$size" -gt $((limit_mib * 1048576)) ]; then
  die "the bundle is over $limit_mib MiB: the device tool carries 64 MiB with the tree"
fi
echo "   run it there: the device tool's run, carry [\".gpu-bundle\"], command" \
  "'OUT=\$OUT bash tests/gpu/run.sh', timeout_s 420 (tests/gpu/README.md)"

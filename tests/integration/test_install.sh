#!/usr/bin/env bash
# Installs libparadev from a build tree into a temporary prefix
# (cmake --install --component client) and builds a consumer outside the tree
# against it, once through pkg-config and once through find_package(paradev)
# (shared and static); each consumer must run and pass.
#
# Usage: test_install.sh BUILD_DIR CONSUMER_SOURCE_DIR
# Extra compiler/linker flags for the consumers (e.g. the sanitizers of the
# build that made the library) come from PARADEV_CONSUMER_FLAGS.
set -euo pipefail
build=$1
src=$2
flags=${PARADEV_CONSUMER_FLAGS:-}
tmp=$(mktemp -d /tmp/paradev-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" --component client >/dev/null
pc=$(find "$prefix" -name paradev.pc | head -n1)
cfg=$(find "$prefix" -name paradevConfig.cmake | head -n1)
for f in "$pc" "$cfg" "$prefix/include/paradev/paradev.h" "$prefix/include/paradev/types.h" \
         "$prefix/include/paradev/transfer.h" "$prefix/include/paradev/shm.h" \
         "$prefix/include/paradev/stream.h" "$prefix/include/paradev/tape.h"; do
  [ -n "$f" ] && [ -f "$f" ] || { echo "FAIL: not installed: $f"; exit 1; }
done
libdir=$(dirname "$(dirname "$pc")")
ls "$libdir"/libparadev.so* "$libdir"/libparadev.a >/dev/null
echo "PASS installed: $(cd "$prefix" && find . -type f | sort | tr '\n' ' ')"

# pkg-config: one line.
export PKG_CONFIG_PATH=$(dirname "$pc")
cc_flags=$(pkg-config --cflags --libs paradev)
# shellcheck disable=SC2086
${CC:-cc} $flags -std=c11 -Wall -Werror "$src/consumer.c" -o "$tmp/consumer_pc" \
  $cc_flags -Wl,-rpath,"$libdir"
"$tmp/consumer_pc"
echo "PASS pkg-config: cc consumer.c \$(pkg-config --cflags --libs paradev)"

# find_package: one line (target_link_libraries(... paradev::paradev)).
cmake -S "$src" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer_shared"
"$tmp/build/consumer_static"
echo "PASS find_package(paradev): paradev::paradev and paradev::paradev_static"

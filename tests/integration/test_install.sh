#!/usr/bin/env bash
# Installs the whole build (`cmake --install BUILD --prefix P`) into a
# temporary prefix and checks that it installs where it says:
#   - every file the install wrote (its install_manifest.txt) is under P, and
#     the expected files are there; when run as root with setpriv and user
#     nobody, a second install runs as nobody into a prefix only nobody may
#     write, so that a write outside the prefix fails outright;
#   - the unit's paths name what was installed: its ExecStartPre (paradevd
#     --check-config --config P/etc/paradev/paradevd.conf) runs and exits 0,
#     its Documentation= files exist, and `systemd-analyze verify` accepts it
#     (skipped, saying so, without systemd-analyze);
#   - the installed `paradev` runs without LD_LIBRARY_PATH (rpath);
#   - `pkg-config --cflags paradev` is only the include directory;
#   - a consumer outside the tree builds against the prefix, once through
#     pkg-config and once through find_package(paradev) (shared and
#     static); each consumer must run and pass.
#
# Usage: test_install.sh BUILD_DIR CONSUMER_SOURCE_DIR
# Extra compiler/linker flags for the consumers (e.g. the sanitizers of the
# build that made the library) come from PARADEV_CONSUMER_FLAGS.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$2
flags=${PARADEV_CONSUMER_FLAGS:-}
tmp=$(mktemp -d /tmp/paradev-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
chmod 0755 "$tmp"
prefix=$tmp/prefix
fail() { echo "FAIL: $*"; exit 1; }

# --- the install, and where it wrote --------------------------------------------
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install --prefix $prefix"; }
manifest=$build/install_manifest.txt
[ -s "$manifest" ] || fail "no $manifest after the install"
outside=$(grep -v "^$prefix/" "$manifest" || true)
[ -z "$outside" ] || fail "installed outside the prefix $prefix: $outside"
while read -r f; do
  [ -e "$f" ] || fail "in the manifest but not installed: $f"
done <"$manifest"
pc=$(find "$prefix" -name paradev.pc | head -n1)
cfg=$(find "$prefix" -name paradevConfig.cmake | head -n1)
[ -n "$pc" ] && [ -n "$cfg" ] || fail "paradev.pc or paradevConfig.cmake not installed"
for h in paradev.h types.h transfer.h shm.h stream.h tape.h optimizer.h; do
  [ -f "$prefix/include/paradev/$h" ] || fail "not installed: $prefix/include/paradev/$h"
done
libdir=$(dirname "$(dirname "$pc")")
unit=$prefix/lib/systemd/system/paradevd.service
for f in "$prefix/include/paradev/paradev.h" "$prefix/include/paradev/types.h" \
         "$prefix/bin/paradev" "$prefix/sbin/paradevd" "$unit" \
         "$prefix/etc/paradev/paradevd.conf" "$prefix/etc/paradev/slurm/prolog.sh" \
         "$prefix/etc/paradev/slurm/epilog.sh" "$prefix/etc/paradev/slurm/task_prolog.sh" \
         "$prefix/lib/sysusers.d/paradev.conf"; do
  [ -f "$f" ] || fail "not installed: $f"
done
ls "$libdir"/libparadev.so* "$libdir"/libparadev.a >/dev/null
echo "PASS installed $(wc -l <"$manifest") files, all under the prefix:" \
     "$(sed "s|^$prefix/||" "$manifest" | sort | tr '\n' ' ')"

# The same install as a user who may write nothing but the prefix. The
# top-level script writes install_manifest.txt into the build tree, which
# that user may not own: run each directory's script instead.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1 &&
   setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups test -r "$build/cmake_install.cmake"; then
  np=$tmp/nobody/prefix
  mkdir -p "$np"
  chown nobody "$np"
  sed -n 's|^ *include("\(.*\)/cmake_install.cmake")$|\1|p' "$build/cmake_install.cmake" >"$tmp/dirs"
  [ -s "$tmp/dirs" ] || fail "no subdirectory scripts in $build/cmake_install.cmake"
  ! grep -q 'file(INSTALL' "$build/cmake_install.cmake" ||
    fail "the top-level cmake_install.cmake installs files itself: run it as nobody too"
  while read -r d; do
    setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups \
      cmake -DCMAKE_INSTALL_PREFIX="$np" -P "$d/cmake_install.cmake" >>"$tmp/nobody.log" 2>&1 ||
      { cat "$tmp/nobody.log"; fail "install as nobody (who may write only $np): $d"; }
  done <"$tmp/dirs"
  diff <(cd "$prefix" && find . -type f | sort) <(cd "$np" && find . -type f | sort) ||
    fail "the install as nobody wrote other files than the one as root"
  echo "PASS install as nobody (who may write only the prefix): the same $(cd "$np" && find . -type f | wc -l) files"
else
  echo "SKIP install as another user: running as $(id -un), not root with setpriv and user nobody" \
       "(the install above already ran without root's rights)" >&2
  [ "$(id -u)" = 0 ] || echo "PASS install as non-root user $(id -un)"
fi

# --- the unit names what was installed ---------------------------------------------
pre=$(sed -n 's/^ExecStartPre=//p' "$unit")
case $pre in
  "$prefix/sbin/paradevd --check-config --config $prefix/etc/paradev/paradevd.conf") ;;
  *) fail "ExecStartPre= does not name the installed daemon and config: $pre" ;;
esac
# shellcheck disable=SC2086
$pre >"$tmp/check.log" 2>&1 || { cat "$tmp/check.log"; fail "the unit's ExecStartPre exits $?: $pre"; }
echo "PASS the unit's ExecStartPre: $pre"
for doc in $(sed -n 's/^Documentation=//p' "$unit"); do
  [ -f "${doc#file:}" ] || fail "Documentation=$doc: not installed"
done
echo "PASS the unit's Documentation= files are installed"
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify "$unit" >"$tmp/verify.log" 2>&1 ||
    { cat "$tmp/verify.log"; fail "systemd-analyze verify $unit"; }
  # Warnings about our unit fail; others (the host's own units, a container
  # without a running systemd) are shown, not judged.
  if grep -q 'paradevd\.service' "$tmp/verify.log"; then
    cat "$tmp/verify.log"
    fail "systemd-analyze verify warned about the unit"
  fi
  [ ! -s "$tmp/verify.log" ] && echo "PASS systemd-analyze verify $unit" ||
    echo "PASS systemd-analyze verify $unit (nothing about paradevd.service; it said: $(tr '\n' ' ' <"$tmp/verify.log"))"
else
  echo "SKIP systemd-analyze verify: systemd-analyze is not installed (Debian: systemd)"
fi

# --- installed programs find libparadev ---------------------------------------------
env -u LD_LIBRARY_PATH "$prefix/bin/paradev" --version >/dev/null ||
  fail "installed paradev does not run without LD_LIBRARY_PATH"
echo "PASS installed paradev finds libparadev (rpath: $(readelf -d "$prefix/bin/paradev" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p'))"

# --- pkg-config: one line -----------------------------------------------------------
export PKG_CONFIG_PATH=$(dirname "$pc")
cflags=$(pkg-config --cflags paradev)
for w in $cflags; do
  case $w in
    -I*) [ "$(cd "${w#-I}" && pwd)" = "$prefix/include" ] || fail "pkg-config --cflags: $w is not $prefix/include" ;;
    *) fail "pkg-config --cflags paradev leaks $w (all of it: $cflags)" ;;
  esac
done
cc_flags=$(pkg-config --cflags --libs paradev)
# shellcheck disable=SC2086
${CC:-cc} $flags -std=c11 -Wall -Werror "$src/consumer.c" -o "$tmp/consumer_pc" \
  $cc_flags -Wl,-rpath,"$libdir"
"$tmp/consumer_pc"
echo "PASS pkg-config: cc consumer.c \$(pkg-config --cflags --libs paradev) (cflags: $cflags)"

# --- find_package: one line (target_link_libraries(... paradev::paradev)) -------------
cmake -S "$src" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer_shared"
"$tmp/build/consumer_static"
echo "PASS find_package(paradev): paradev::paradev and paradev::paradev_static"

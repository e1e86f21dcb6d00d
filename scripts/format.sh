#!/usr/bin/env bash
# Formats paradev's C sources with the repository's .clang-format
# (clang-format 14, Debian's clang-format package).
#
#   scripts/format.sh           rewrite the files in place
#   scripts/format.sh --check   change nothing; list the files that would
#                               change and exit 1 if any would
#
# The files: every tracked *.c and *.h. Left out: CUDA kernels (*.cu, *.cuh),
# whose launch syntax and layout follow CUDA's own habits, and the generated
# protobuf-c code, which lives in build trees and is not tracked.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
command -v "$CLANG_FORMAT" >/dev/null ||
  { echo "format.sh: $CLANG_FORMAT not found (apt-get install clang-format)" >&2; exit 2; }
mapfile -t files < <(git ls-files -- '*.c' '*.h')
if [ "${1:-}" = --check ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! "$CLANG_FORMAT" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
      echo "would reformat: $f"
      bad=1
    fi
  done
  exit $bad
fi
"$CLANG_FORMAT" --style=file -i "${files[@]}"

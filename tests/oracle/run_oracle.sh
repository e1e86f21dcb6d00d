#!/usr/bin/env bash
# ctest oracle.numpy: checks the engine against NumPy.
# Usage: run_oracle.sh PATH-TO-oracle_driver [oracle.py options]
# Exit status 77 (ctest SKIP) when Debian's python3-numpy is missing. Debian's
# numpy imports only under /usr/bin/python3 (the python3 first on PATH may be
# another interpreter), so that one is used.
set -u
if [ $# -lt 1 ]; then
  echo "usage: $0 PATH-TO-oracle_driver [oracle.py options]" >&2
  exit 2
fi
driver=$1
shift
py=/usr/bin/python3
if [ ! -x "$py" ] || ! "$py" -c 'import numpy' >/dev/null 2>&1; then
  echo "SKIP: python3-numpy not installed (apt-get install python3-numpy)"
  exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
exec "$py" "$here/oracle.py" --driver "$driver" "$@"

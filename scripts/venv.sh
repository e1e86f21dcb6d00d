#!/usr/bin/env bash
# Creates (once) the Python virtual environment the tests use for what
# Debian lacks: the safetensors package, pinned. It is made from Debian's
# /usr/bin/python3 with --system-site-packages, so Debian's numpy (and the
# rest of python3-*) is the one the tests import.
#
#   scripts/venv.sh DIR     (default: build/venv)
#
# Idempotent: a venv that already has the pinned version is left alone.
# Exits non-zero, saying why, when the venv cannot be made (no python3-venv,
# no network to PyPI): the tests that need it then fail rather than skip.
set -euo pipefail
SAFETENSORS_VERSION=0.4.5
dir=${1:-build/venv}
py=/usr/bin/python3

if [ -x "$dir/bin/python3" ] &&
   "$dir/bin/python3" -c "import safetensors, numpy, sys; sys.exit(safetensors.__version__ != '$SAFETENSORS_VERSION')" 2>/dev/null; then
  echo "venv: $dir has safetensors $SAFETENSORS_VERSION and Debian's numpy"
  exit 0
fi
if [ ! -x "$py" ]; then
  echo "venv: $py not found; install python3 (scripts/setup.sh does)" >&2
  exit 1
fi
if ! "$py" -c "import numpy" 2>/dev/null; then
  echo "venv: $py cannot import numpy; install python3-numpy (scripts/setup.sh does)" >&2
  exit 1
fi
echo "venv: creating $dir from $py (--system-site-packages, so Debian's numpy is used)"
if ! "$py" -m venv --system-site-packages "$dir"; then
  echo "venv: '$py -m venv' failed; install python3-venv (scripts/setup.sh does)" >&2
  exit 1
fi
echo "venv: pip install safetensors==$SAFETENSORS_VERSION into $dir"
if ! "$dir/bin/python3" -m pip install --quiet --disable-pip-version-check \
     "safetensors==$SAFETENSORS_VERSION"; then
  echo "venv: pip could not install safetensors==$SAFETENSORS_VERSION (is PyPI reachable?)" >&2
  exit 1
fi
"$dir/bin/python3" -c "import safetensors, numpy; print('venv: ready: safetensors', safetensors.__version__, 'numpy', numpy.__version__)"

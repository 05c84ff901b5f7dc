#!/bin/sh
# Print the path of the newest CPython >= 3.10 found here (with venv), for the core test environment
# (`make test`'s second run: bert_of without OneFlow or TensorFlow, on NumPy 2). PYTHON_CORE overrides.
ver() { "$1" -c 'import sys, venv, ensurepip; v = sys.version_info; assert v >= (3, 10); print("%d %d" % v[:2])' 2>/dev/null; }
best=""; bestv=0
try() {
  [ -n "$1" ] || return 0
  p=$(command -v "$1" 2>/dev/null) || return 0
  v=$(ver "$p") || return 0
  n=$(echo "$v" | awk '{ print $1 * 1000 + $2 }')
  if [ "$n" -gt "$bestv" ]; then best=$p; bestv=$n; fi
}
if [ -n "${PYTHON_CORE:-}" ]; then
  if ver "$PYTHON_CORE" >/dev/null; then command -v "$PYTHON_CORE"; exit 0; fi
  echo "PYTHON_CORE=$PYTHON_CORE is not a working Python >= 3.10 with venv" >&2; exit 1
fi
for m in 20 19 18 17 16 15 14 13 12 11 10; do
  try "python3.$m"
  for p in /usr/bin/python3.$m /usr/local/bin/python3.$m "$HOME/.local/bin/python3.$m"; do
    [ -x "$p" ] && try "$p"
  done
done
try python3
if command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root)
  for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.[0-9]+\.[0-9]+$'); do
    try "$root/versions/$v/bin/python"
  done
fi
if [ -n "$best" ]; then echo "$best"; exit 0; fi
echo "no Python >= 3.10 with venv found for the core test environment (set PYTHON_CORE)" >&2
exit 1

#!/bin/sh
# Print the path of a working Python 3.10 interpreter, or explain how to get one.
# OneFlow 0.9.0 (its last release) ships real wheels only for CPython 3.10.
ok() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' >/dev/null 2>&1; }
for c in "${PYTHON310:-}" python3.10 python3 python; do
  [ -n "$c" ] || continue
  p=$(command -v "$c" 2>/dev/null) || continue
  if ok "$p"; then echo "$p"; exit 0; fi
done
if command -v pyenv >/dev/null 2>&1; then
  for v in $(pyenv versions --bare 2>/dev/null | grep '^3\.10' | sort -t. -k3 -n -r); do
    p="$(pyenv root)/versions/$v/bin/python"
    if ok "$p"; then echo "$p"; exit 0; fi
  done
fi
for p in /usr/bin/python3.10 /usr/local/bin/python3.10 "$HOME/.local/bin/python3.10"; do
  if [ -x "$p" ] && ok "$p"; then echo "$p"; exit 0; fi
done
cat >&2 <<'MSG'
bert_of needs Python 3.10 (OneFlow 0.9.0, its last release, has wheels only for 3.10).
Get it with one of:
  pyenv install 3.10.13            (then re-run make)
  uv python install 3.10           (then: PYTHON310=$(uv python find 3.10) make env)
  conda create -n py310 python=3.10 (then: PYTHON310=$CONDA_PREFIX/bin/python make env)
  apt-get install python3.10 python3.10-venv   (Ubuntu/Debian with 3.10 packaged)
Or point PYTHON310 at an existing 3.10 interpreter.
MSG
exit 1

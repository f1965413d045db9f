#!/usr/bin/env bash
# The test command of the README (and of .ci/run). It says what it installs before installing it:
#   1. offsim with its test extras, with pip (".[test]": pytest, hypothesis, nbmake, ipykernel, dask,
#      ruff, mypy);
#   2. when `chromium` is missing and apt-get is there, Debian's `chromium` (the headless browser
#      the report's rendering test uses); OFFSIM_NO_BROWSER_INSTALL=1 skips this, and without a
#      browser that one test is skipped;
# then the static checks (ruff on offsim/, tests/ and benchmarks/, mypy on offsim/, configured in
# pyproject.toml), then the whole
# suite, notebooks and the README's tour included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "test.sh: installing offsim with its test extras (pip install '.[test]')" >&2
python -m pip install --quiet --disable-pip-version-check ".[test]"
if command -v chromium >/dev/null 2>&1; then
  echo "test.sh: using the installed chromium for the report's browser test" >&2
elif [ "${OFFSIM_NO_BROWSER_INSTALL:-0}" = "1" ]; then
  echo "test.sh: OFFSIM_NO_BROWSER_INSTALL=1: no browser installed; the browser test will be skipped" >&2
elif command -v apt-get >/dev/null 2>&1; then
  echo "test.sh: installing Debian's chromium (apt-get) for the report's browser test" >&2
  { apt-get install -y -qq chromium || { apt-get update -qq && apt-get install -y -qq chromium; }; } >/dev/null 2>&1 \
    || echo "test.sh: could not install chromium; the browser test will be skipped" >&2
else
  echo "test.sh: no chromium and no apt-get; the browser test will be skipped" >&2
fi
echo "test.sh: static checks (ruff check offsim tests benchmarks; mypy offsim)" >&2
python -m ruff check offsim tests benchmarks
python -m mypy offsim
echo "test.sh: running pytest $*" >&2
python -m pytest "$@"

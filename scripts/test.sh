#!/usr/bin/env bash
# The test command of the README (and of .ci/run): installs offsim with its test extras, the
# headless browser the report test uses (Debian's chromium, when apt is available), then runs
# the whole suite, notebooks included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check ".[test]"
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  { apt-get install -y -qq chromium || { apt-get update -qq && apt-get install -y -qq chromium; }; } >/dev/null 2>&1 \
    || echo "note: could not install chromium; the browser rendering test will be skipped"
fi
python -m pytest "$@"

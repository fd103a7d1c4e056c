#!/bin/sh
# test_serve_browser.sh: the chat page of `kiln serve` in headless Chromium
# (tests/serve/browser.py, Selenium). Needs Debian's chromium,
# chromium-driver and python3-selenium (CI installs them); skipped with a
# message otherwise. Run by `make test`.
. "$(dirname "$0")/kn_test.sh"
# the first python3 that has Selenium (Debian's package lives in the system
# python3, which a pyenv or venv python3 earlier on PATH does not see)
for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import selenium' 2>/dev/null; then
        exec env BUILD="${BUILD:-build}" "$py" tests/serve/browser.py
    fi
done
skip serve_browser "python3-selenium not found (CI installs chromium chromium-driver python3-selenium)"
totals

#!/bin/sh
# test_serve_e2e.sh: `kiln serve` end to end over loopback with a small model
# (tests/serve/e2e.py: stdlib HTTP client). The soak test is
# tests/test_serve_soak.sh, the chat page in a browser
# tests/test_serve_browser.sh. Run by `make test`.
. "$(dirname "$0")/kn_test.sh"
if ! command -v python3 >/dev/null 2>&1; then
    skip serve_e2e "python3 not found"; totals
fi
exec env BUILD="${BUILD:-build}" python3 tests/serve/e2e.py

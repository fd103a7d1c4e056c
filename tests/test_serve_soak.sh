#!/bin/sh
# test_serve_soak.sh: a short soak of `kiln serve` (tests/serve/soak.py: 16
# clients for KN_SOAK_SECONDS, default 25; CI runs a longer one). Run by
# `make test`.
. "$(dirname "$0")/kn_test.sh"
if ! command -v python3 >/dev/null 2>&1; then
    skip serve_soak "python3 not found"; totals
fi
exec env BUILD="${BUILD:-build}" python3 tests/serve/soak.py "${KN_SOAK_SECONDS:-25}"

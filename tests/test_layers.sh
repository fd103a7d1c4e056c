#!/bin/sh
# test_layers.sh: the layers of src/ only point down (docs/ARCHITECTURE.md):
# scripts/check_layers.py reads every include of src/ and tools/ and, from
# the built objects in BUILD, every symbol they use; a back-edge (a lower
# layer using a higher one, or tools/ using an internal header or function)
# fails here, so it fails `make test`.
#
# Run by `make test` (tests/run.sh passes BUILD).
. "$(dirname "$0")/kn_test.sh"    # ok, bad, skip, totals
BUILD=${BUILD:-build}
if ! command -v python3 >/dev/null 2>&1; then
    skip layers "python3 not found"
else
    out=$(BUILD="$BUILD" python3 scripts/check_layers.py 2>&1)
    if [ $? -eq 0 ]; then
        ok layers
    else
        bad layers "a layer points up (scripts/check_layers.py):"
        echo "$out" | grep -v '^#' | sed 's/^/    /'
    fi
fi
totals

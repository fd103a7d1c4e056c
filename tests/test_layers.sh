#!/bin/sh
# test_layers.sh: the layers of src/ only point down (docs/ARCHITECTURE.md):
# scripts/check_layers.py reads every include of src/ and tools/ and, from
# the built objects in BUILD, every symbol they use; a back-edge (a lower
# layer using a higher one, or tools/ using an internal header or function)
# fails here, so it fails `make test`.
#
# Run by `make test` (tests/run.sh passes BUILD).
pass=0; fail=0; skip=0
BUILD=${BUILD:-build}
if ! command -v python3 >/dev/null 2>&1; then
    skip=1; echo "skip layers: python3 not found"
else
    out=$(BUILD="$BUILD" python3 scripts/check_layers.py 2>&1)
    if [ $? -eq 0 ]; then
        pass=1; echo "ok   layers"
    else
        fail=1; echo "FAIL layers: a layer points up (scripts/check_layers.py):"
        echo "$out" | grep -v '^#' | sed 's/^/    /'
    fi
fi
echo "# totals: $pass $fail $skip"
[ $fail -eq 0 ]

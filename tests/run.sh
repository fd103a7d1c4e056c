#!/bin/sh
# Runs every test binary given on the command line and adds up their totals.
# Ends with the line "N passed, N failed, N skipped"; exits non-zero on any
# failure or on a binary that crashed without printing its totals.
pass=0; fail=0; skip=0; crashed=0
for t in "$@"; do
    name=$(basename "$t")
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -v '^# totals' | sed "s|^|[$name] |"
    tot=$(printf '%s\n' "$out" | grep '^# totals:' | tail -1)
    if [ -z "$tot" ]; then
        echo "[$name] CRASHED (exit $rc) before printing its totals"
        fail=$((fail + 1)); crashed=1; continue
    fi
    p=$(echo "$tot" | awk '{print $3}'); f=$(echo "$tot" | awk '{print $4}'); s=$(echo "$tot" | awk '{print $5}')
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    if [ $rc -ne 0 ] && [ "$f" = 0 ]; then
        echo "[$name] exited $rc with no failed test"; fail=$((fail + 1))
    fi
done
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ] && [ $crashed -eq 0 ]

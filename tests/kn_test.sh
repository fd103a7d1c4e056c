# kn_test.sh: the tally every script test (tests/test_*.sh) sources, the shell
# twin of kn_test.h: `ok NAME`, `bad NAME WHY` and `skip NAME WHY` print one
# line each; `totals` prints "# totals: P F S" (which tests/run.sh adds up)
# and exits non-zero when a test failed.
pass=0; fail=0; skip=0
ok()   { pass=$((pass + 1)); echo "ok   $1"; }
bad()  { fail=$((fail + 1)); echo "FAIL $1: $2"; }
skip() { skip=$((skip + 1)); echo "skip $1: $2"; }
totals() { echo "# totals: $pass $fail $skip"; [ $fail -eq 0 ]; exit $?; }

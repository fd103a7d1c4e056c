#!/bin/sh
# bench_graphs.sh: kiln bench on the GPU with CUDA graphs off and on
# (KN_CUDA_GRAPH=0 / 1, src/runtime/replay.c), alternating in rounds so both
# see the same drift (decode on a lent H100 swings +-15 % from round to
# round); prints every round, the medians and the launch counts.
#   [ROUNDS=5] sh scripts/bench_graphs.sh KILN MODEL [kiln bench options...]
# default options: --backend cuda --gpu-dtype bf16 --bench-prompt 512 -n 128 -r 3
# e.g. (a GPU machine without model files):
#   python3 scripts/make_random_smollm2.py /tmp/smol && sh scripts/bench_graphs.sh build-cuda/kiln /tmp/smol
set -eu
KILN=$1; MODEL=$2; shift 2
[ $# -gt 0 ] || set -- --backend cuda --gpu-dtype bf16 --bench-prompt 512 -n 128 -r 3
ROUNDS=${ROUNDS:-5}
med() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
one() {   # prints "pp tg" of one run with KN_CUDA_GRAPH=$1
    g=$1; shift
    KN_CUDA_GRAPH=$g "$KILN" bench -m "$MODEL" "$@" 2>/dev/null > /tmp/bench_graphs.$$ || { echo "kiln bench failed" >&2; exit 1; }
    awk -F'|' '/ pp[0-9]| tg[0-9]/ {gsub(/ /,"",$7); printf "%s ", $7}' /tmp/bench_graphs.$$
}
opp=; otg=; npp=; ntg=
r=0
while [ "$r" -lt "$ROUNDS" ]; do
    o=$(one 0 "$@"); launches_off=$(grep '^decode:' /tmp/bench_graphs.$$ || true)
    n=$(one 1 "$@"); launches_on=$(grep '^decode:' /tmp/bench_graphs.$$ || true)
    echo "round $r: graphs off pp/tg $o; on $n"
    opp="$opp $(echo "$o" | cut -d' ' -f1)"; otg="$otg $(echo "$o" | cut -d' ' -f2)"
    npp="$npp $(echo "$n" | cut -d' ' -f1)"; ntg="$ntg $(echo "$n" | cut -d' ' -f2)"
    r=$((r + 1))
done
rm -f /tmp/bench_graphs.$$
echo "options: $*; rounds: $ROUNDS"
echo "graphs off: $launches_off"
echo "graphs on:  $launches_on"
echo "| test | graphs off (tok/s) | graphs on (tok/s) | on/off |"
echo "|---|---|---|---|"
for t in pp tg; do
    if [ $t = pp ]; then a=$(echo "$opp" | med); b=$(echo "$npp" | med); else a=$(echo "$otg" | med); b=$(echo "$ntg" | med); fi
    echo "| $t | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}') |"
done

#!/bin/sh
# bench_ab.sh: two kiln programs (before/after a change) on the same model,
# alternating in rounds so both see the same load drift; prints the median
# prefill and decode tokens/s of each and the ratio.
#   [ROUNDS=5] sh scripts/bench_ab.sh OLD_KILN NEW_KILN MODEL [kiln bench options...]
# (options both programs know: --bench-prompt N, -n N, -r N, -t N, --backend)
# e.g.  sh scripts/bench_ab.sh /tmp/base/build/kiln build/kiln models/SmolLM2-135M-Instruct.Q4_1.gguf -t 2
set -eu
OLD=$1; NEW=$2; MODEL=$3; shift 3
ROUNDS=${ROUNDS:-5}
med() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
one() { k=$1; shift; "$k" bench -m "$MODEL" "$@" 2>/dev/null | awk -F'|' '/ pp[0-9]| tg[0-9]/ {gsub(/ /,"",$7); printf "%s ", $7}'; }
opp=; otg=; npp=; ntg=
r=0
while [ "$r" -lt "$ROUNDS" ]; do
    o=$(one "$OLD" "$@"); n=$(one "$NEW" "$@")
    opp="$opp $(echo "$o" | cut -d' ' -f1)"; otg="$otg $(echo "$o" | cut -d' ' -f2)"
    npp="$npp $(echo "$n" | cut -d' ' -f1)"; ntg="$ntg $(echo "$n" | cut -d' ' -f2)"
    r=$((r + 1))
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); rounds: $ROUNDS; options: $*"
echo "rounds, before: pp$opp / tg$otg"
echo "rounds, after:  pp$npp / tg$ntg"
echo "| test | before (tok/s) | after (tok/s) | after/before |"
echo "|---|---|---|---|"
for t in pp tg; do
    if [ $t = pp ]; then a=$(echo "$opp" | med); b=$(echo "$npp" | med); else a=$(echo "$otg" | med); b=$(echo "$ntg" | med); fi
    echo "| $t | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}') |"
done

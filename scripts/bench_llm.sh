#!/bin/sh
# bench_llm.sh: kiln vs llama.cpp on the same GGUF model, same threads, same
# sizes, in one run; prints a markdown table with the ratio.
#   [ROUNDS=3] sh scripts/bench_llm.sh [MODEL] [THREADS] [N_PROMPT] [N_GEN] [REPS]
set -eu
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
T=${2:-$(nproc)}
NP=${3:-512}
NG=${4:-128}
REPS=${5:-3}
[ -f "$MODEL" ] || { echo "bench_llm: $MODEL missing (make run fetches the default model)" >&2; exit 1; }
[ -x build/kiln ] || make -s build/kiln
# ROUNDS alternating kiln / llama.cpp runs (each the median of REPS), then the
# median over rounds: on a shared VM the load drifts within a minute, and
# alternating lets both see the same drift.
ROUNDS=${ROUNDS:-3}
have_llama=1
python3 -c 'import llama_cpp' 2>/dev/null || {
    echo "bench_llm: llama-cpp-python not installed; see scripts/bench_llamacpp.py for the install line" >&2
    have_llama=0; }
kpp_all=; ktg_all=; lpp_all=; ltg_all=
r=0
while [ $r -lt "$ROUNDS" ]; do
    k=$(./build/kiln bench -m "$MODEL" -t "$T" --bench-prompt "$NP" -n "$NG" -r "$REPS" | awk -F'|' '/ pp| tg/ {gsub(/ /,"",$7); printf "%s ", $7}')
    kpp_all="$kpp_all $(echo "$k" | cut -d' ' -f1)"; ktg_all="$ktg_all $(echo "$k" | cut -d' ' -f2)"
    if [ $have_llama = 1 ]; then
        l=$(python3 scripts/bench_llamacpp.py "$MODEL" "$NP" "$NG" "$T" "$REPS")
        lpp_all="$lpp_all $(echo "$l" | awk '{print $3}')"; ltg_all="$ltg_all $(echo "$l" | awk '{print $5}')"
    fi
    r=$((r + 1))
done
median() { if [ -z "$*" ]; then echo nan; else printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; fi; }
kpp=$(median $kpp_all); ktg=$(median $ktg_all); lpp=$(median $lpp_all); ltg=$(median $ltg_all)
echo "rounds: kiln pp$kpp_all / tg$ktg_all; llama.cpp pp${lpp_all:- n/a} / tg${ltg_all:- n/a}" >&2
echo "| model | threads | test | kiln tok/s | llama.cpp tok/s | kiln / llama.cpp |"
echo "|---|---|---|---|---|---|"
for row in "pp$NP $kpp $lpp" "tg$NG $ktg $ltg"; do
    set -- $row
    ratio=$(awk -v a="$2" -v b="$3" 'BEGIN { if (b == "nan" || b == 0) print "n/a"; else printf "%.2fx", a / b }')
    echo "| $(basename "$MODEL") | $T | $1 | $2 | $3 | $ratio |"
done

#!/bin/sh
# bench_llm.sh: kiln vs llama.cpp on the same GGUF model, same threads, same
# sizes, in one run; prints a markdown table with the ratio.
#   sh scripts/bench_llm.sh [MODEL] [THREADS] [N_PROMPT] [N_GEN] [REPS]
set -eu
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
T=${2:-$(nproc)}
NP=${3:-512}
NG=${4:-128}
REPS=${5:-3}
[ -f "$MODEL" ] || { echo "bench_llm: $MODEL missing (make run fetches the default model)" >&2; exit 1; }
[ -x build/kiln ] || make -s build/kiln
k=$(./build/kiln bench -m "$MODEL" -t "$T" --bench-prompt "$NP" -n "$NG" -r "$REPS" | awk -F'|' '/ pp| tg/ {gsub(/ /,"",$7); printf "%s ", $7}')
kpp=$(echo "$k" | cut -d' ' -f1); ktg=$(echo "$k" | cut -d' ' -f2)
if python3 -c 'import llama_cpp' 2>/dev/null; then
    l=$(python3 scripts/bench_llamacpp.py "$MODEL" "$NP" "$NG" "$T" "$REPS")
    lpp=$(echo "$l" | awk '{print $3}'); ltg=$(echo "$l" | awk '{print $5}')
else
    echo "bench_llm: llama-cpp-python not installed; see scripts/bench_llamacpp.py for the install line" >&2
    lpp=nan; ltg=nan
fi
echo "| model | threads | test | kiln tok/s | llama.cpp tok/s | kiln / llama.cpp |"
echo "|---|---|---|---|---|---|"
for row in "pp$NP $kpp $lpp" "tg$NG $ktg $ltg"; do
    set -- $row
    ratio=$(awk -v a="$2" -v b="$3" 'BEGIN { if (b == "nan" || b == 0) print "n/a"; else printf "%.2fx", a / b }')
    echo "| $(basename "$MODEL") | $T | $1 | $2 | $3 | $ratio |"
done

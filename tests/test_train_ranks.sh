#!/bin/sh
# test_train_ranks.sh: `kiln train --gpus N` on CPU ranks (issue 16): two
# data-parallel ranks write a checkpoint, and with `--zero 1` (each rank
# keeps half of the optimizer state) the very same bytes; one process
# resumes that file with the same global batch (checkpoints load on any
# number of ranks). A tiny char model on a made-up text: about a second.
#
# Run by `make test` (tests/run.sh passes BUILD).
. "$(dirname "$0")/kn_test.sh"    # ok, bad, skip, totals

BUILD=${BUILD:-build}
KILN="$BUILD/kiln"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
i=0
while [ $i -lt 200 ]; do echo "to be or not to be, that is the question; so $i."; i=$((i + 1)); done > "$tmp/text.txt"
run() {   # run NAME ARGS...: kiln train char with the common shape, its output in $tmp/NAME.log
    n=$1; shift
    "$KILN" train char --data "$tmp/text.txt" --layers 1 --dim 32 --heads 2 --ctx 16 --eval-every 100 \
        --eval-batches 1 --sample-len 0 --log-every 100 "$@" > "$tmp/$n.log" 2>&1
}

if [ ! -x "$KILN" ]; then
    bad zero1_checkpoint_equals_data_parallel "$KILN is not built"
else
    if ! run ddp --gpus 2 --batch 4 --steps 4 --out "$tmp/ddp.ckpt"; then
        bad zero1_checkpoint_equals_data_parallel "--gpus 2 failed: $(tail -3 "$tmp/ddp.log")"
    elif ! run zero --gpus 2 --zero 1 --batch 4 --steps 4 --out "$tmp/zero.ckpt"; then
        bad zero1_checkpoint_equals_data_parallel "--gpus 2 --zero 1 failed: $(tail -3 "$tmp/zero.log")"
    elif ! cmp -s "$tmp/ddp.ckpt" "$tmp/zero.ckpt"; then
        bad zero1_checkpoint_equals_data_parallel "the ZeRO-1 checkpoint differs from plain data parallelism's"
    elif ! grep -q "ZeRO-1" "$tmp/zero.log"; then
        bad zero1_checkpoint_equals_data_parallel "the run did not say it shards the optimizer state"
    else
        ok zero1_checkpoint_equals_data_parallel
    fi
    # the two-rank file resumed by one process (global batch 8 both ways)
    if run resume --batch 8 --steps 6 --resume "$tmp/zero.ckpt" --out "$tmp/resumed.ckpt" &&
        grep -q "^final:" "$tmp/resume.log"; then
        ok zero1_checkpoint_resumes_on_one_process
    else
        bad zero1_checkpoint_resumes_on_one_process "$(tail -3 "$tmp/resume.log")"
    fi
    if run usage --zero 1 --batch 4 --steps 2; then
        bad zero_needs_ranks "--zero 1 without --gpus ran"
    elif grep -q "give --gpus N" "$tmp/usage.log"; then
        ok zero_needs_ranks
    else
        bad zero_needs_ranks "message: $(tail -1 "$tmp/usage.log")"
    fi
fi
totals

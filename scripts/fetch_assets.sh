#!/bin/sh
# fetch_assets.sh [DIR]: download the public files the tests, the README
# examples and `kiln train` use (MNIST, tiny shakespeare, a TinyStories
# sample, llama2.c's stories260K with its tokenizers, llama.cpp's vocabulary
# test files, a tiny random GGUF, llm.c's GPT-2 tokenizer) from their public
# sources, each checked against its sha256, into DIR (default $KN_ASSETS, else
# ./assets). Then:   KN_ASSETS=./assets make test
#
# Files already there with the right contents are kept; nothing half-written is
# left behind (downloads go to FILE.part and are moved into place once checked).
# Exits 0 when every file is present and correct, 1 otherwise, 2 on bad usage.
# Needs curl or wget, sha256sum (or shasum) and gzip.
set -u

usage() {
    echo "usage: sh scripts/fetch_assets.sh [DIR]   (default: \$KN_ASSETS, else ./assets)"
}
case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    -*) echo "fetch_assets.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
esac
[ $# -le 1 ] || { usage >&2; exit 2; }
DEST=${1:-${KN_ASSETS:-./assets}}

# path | bytes | check | sha256 | URLs (tried in order; pinned commits first)
# check: "raw" hashes the file; "gunzip" hashes the gunzipped contents (MNIST:
# mirrors may recompress, the data is what matters); "prefix" downloads only
# the first <bytes> bytes with an HTTP Range request.
HF=https://huggingface.co
GH=https://raw.githubusercontent.com
LLAMACPP_A=f4ab2a41476600a98067a9474ea8f9e6db41bcfa   # llama.cpp commits of the vocab files
LLAMACPP_B=07e4351ce663a7802b31f92fd7bc0e555c2044b6   # and of their test cases
MNIST=https://ossci-datasets.s3.amazonaws.com/mnist
ASSETS="
llama2c/stories260K.bin|1056540|raw|b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696|$HF/karpathy/tinyllamas/resolve/main/stories260K/stories260K.bin
llama2c/tok512.bin|6227|raw|037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312|$HF/karpathy/tinyllamas/resolve/main/stories260K/tok512.bin
llama2c/tokenizer.bin|433869|raw|50a52ef822ee9e83de5ce9d0be0a025a773d019437f58b5ff9dcafb063ece361|$GH/karpathy/llama2.c/c02865df300f3bd9e567ce061000dc23bf785a17/tokenizer.bin $GH/karpathy/llama2.c/master/tokenizer.bin
gpt2/gpt2_tokenizer.bin|372108|raw|6f3abc21e444e4e8300e225f4e03da48ea121cf17e30f67009b8dad7a66c2f13|$HF/datasets/karpathy/llmc-starter-pack/resolve/main/gpt2_tokenizer.bin
gguf/llama-2-tiny-random.gguf|1750560|raw|81f226c62d28ed4a1a9b9fa080fcd9f0cc40e0f9d5680036583ff98fbcd035cb|$HF/aladar/llama-2-tiny-random-GGUF/resolve/8d5321916486e1d33c46b16990e8da6567785769/llama-2-tiny-random.gguf $HF/aladar/llama-2-tiny-random-GGUF/resolve/main/llama-2-tiny-random.gguf
gguf/ggml-vocab-llama-spm.gguf|723869|raw|16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69|$GH/ggml-org/llama.cpp/$LLAMACPP_A/models/ggml-vocab-llama-spm.gguf $GH/Raudbjorn/ggml-llama.cpp/$LLAMACPP_A/models/ggml-vocab-llama-spm.gguf
gguf/ggml-vocab-llama-spm.gguf.inp|1943|raw|be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0|$GH/ggml-org/llama.cpp/$LLAMACPP_B/models/ggml-vocab-llama-spm.gguf.inp $GH/Raudbjorn/ggml-llama.cpp/$LLAMACPP_B/models/ggml-vocab-llama-spm.gguf.inp
gguf/ggml-vocab-llama-spm.gguf.out|2685|raw|ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29|$GH/ggml-org/llama.cpp/$LLAMACPP_B/models/ggml-vocab-llama-spm.gguf.out $GH/Raudbjorn/ggml-llama.cpp/$LLAMACPP_B/models/ggml-vocab-llama-spm.gguf.out
gguf/ggml-vocab-gpt-2.gguf|1766807|raw|cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac|$GH/ggml-org/llama.cpp/$LLAMACPP_A/models/ggml-vocab-gpt-2.gguf $GH/Raudbjorn/ggml-llama.cpp/$LLAMACPP_A/models/ggml-vocab-gpt-2.gguf
gguf/ggml-vocab-gpt-2.gguf.inp|1943|raw|be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0|$GH/ggml-org/llama.cpp/$LLAMACPP_B/models/ggml-vocab-gpt-2.gguf.inp $GH/Raudbjorn/ggml-llama.cpp/$LLAMACPP_B/models/ggml-vocab-gpt-2.gguf.inp
gguf/ggml-vocab-gpt-2.gguf.out|2147|raw|48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60|$GH/ggml-org/llama.cpp/$LLAMACPP_B/models/ggml-vocab-gpt-2.gguf.out $GH/Raudbjorn/ggml-llama.cpp/$LLAMACPP_B/models/ggml-vocab-gpt-2.gguf.out
datasets/tinyshakespeare/input.txt|1115394|raw|86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed|$GH/karpathy/char-rnn/370cbcd448eb7daf32f21a6be560b70e0b33c4e3/data/tinyshakespeare/input.txt $GH/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
datasets/tinystories/TinyStories-train.first2MiB.txt|2097152|prefix|5352b299dcb1a32898b2d779b145b5a05f3e1265953fd21c264c9f9f9c9ae33d|$HF/datasets/roneneldan/TinyStories/resolve/main/TinyStories-train.txt
datasets/mnist/train-images-idx3-ubyte.gz|9912422|gunzip|ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db|$MNIST/train-images-idx3-ubyte.gz
datasets/mnist/train-labels-idx1-ubyte.gz|28881|gunzip|65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5|$MNIST/train-labels-idx1-ubyte.gz
datasets/mnist/t10k-images-idx3-ubyte.gz|1648877|gunzip|0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7|$MNIST/t10k-images-idx3-ubyte.gz
datasets/mnist/t10k-labels-idx1-ubyte.gz|4542|gunzip|ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2|$MNIST/t10k-labels-idx1-ubyte.gz
"

say() { echo "fetch_assets: $*" >&2; }

if command -v sha256sum >/dev/null 2>&1; then sha256() { sha256sum | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then sha256() { shasum -a 256 | cut -d' ' -f1; }
else say "neither sha256sum nor shasum found (install coreutils)"; exit 1; fi
if command -v curl >/dev/null 2>&1; then DL=curl
elif command -v wget >/dev/null 2>&1; then DL=wget
else say "neither curl nor wget found (apt-get install curl)"; exit 1; fi

# sha256 of FILE as the check kind sees it (empty when gunzip fails)
digest() {  # FILE CHECK
    if [ "$2" = gunzip ]; then gzip -dc "$1" 2>/dev/null | sha256 || true
    else sha256 < "$1"; fi
}

# Download URL into FILE (whole, or its first BYTES bytes with a Range
# request; a server that ignores the range is cut off by head). Returns the
# downloader's status; 100 means the host could not be reached at all.
download() {  # URL FILE MODE BYTES
    if [ "$3" = prefix ]; then
        if [ $DL = curl ]; then
            curl -sS -fL --connect-timeout 20 --retry 2 -r "0-$(($4 - 1))" "$1" 2>"$FILE_ERR" | head -c "$4" > "$2"
        else
            wget -q --timeout=20 --tries=2 --header "Range: bytes=0-$(($4 - 1))" -O - "$1" 2>"$FILE_ERR" | head -c "$4" > "$2"
        fi
        # the pipeline's status is head's: judge by what arrived
        [ -s "$2" ] && return 0
        unreachable "$1" && return 100
        return 1
    fi
    if [ $DL = curl ]; then
        curl -sS -fL --connect-timeout 20 --retry 2 -o "$2" "$1" 2>"$FILE_ERR"; rc=$?
        case $rc in 0) return 0 ;; 5|6|7|28|35) return 100 ;; *) return $rc ;; esac
    else
        wget -q --timeout=20 --tries=2 -O "$2" "$1" 2>"$FILE_ERR"; rc=$?
        case $rc in 0) return 0 ;; 4) return 100 ;; *) return $rc ;; esac
    fi
}
# true when the last error names a host or connection failure
unreachable() {
    grep -qiE "resolve|connect|timed out|network|unable to" "$FILE_ERR" 2>/dev/null
}

mkdir -p "$DEST" || { say "cannot create $DEST"; exit 1; }
FILE_ERR=$(mktemp) || exit 1
PART=""
cleanup() { [ -n "$PART" ] && rm -f "$PART"; rm -f "$FILE_ERR"; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

ok=0; fetched=0; failed=0
while IFS='|' read -r path bytes check want urls; do
    [ -n "$path" ] || continue
    file="$DEST/$path"
    if [ -f "$file" ]; then
        if [ "$(digest "$file" "$check")" = "$want" ]; then
            say "$path: present, sha256 ok"
            ok=$((ok + 1)); continue
        fi
        say "$path: present but its sha256 is not the expected one; downloading it again"
    fi
    mkdir -p "$(dirname "$file")" || { say "cannot create $(dirname "$file")"; exit 1; }
    PART="$file.part"
    done_one=0
    for url in $urls; do
        say "$path: downloading $bytes bytes from $url"
        download "$url" "$PART" "$check" "$bytes"; rc=$?
        if [ $rc -eq 100 ]; then
            rm -f "$PART"; PART=""
            say "cannot reach $url ($(head -n 1 "$FILE_ERR"))."
            say "The network seems unreachable. On a machine with network access, download"
            say "that URL to $file (sha256 $want), or copy a complete assets directory here,"
            say "or point KN_ASSETS at one; then run this script again to check the files."
            exit 1
        fi
        if [ $rc -ne 0 ]; then
            say "$path: download failed (exit $rc: $(head -n 1 "$FILE_ERR"))"
            rm -f "$PART"; continue
        fi
        got=$(digest "$PART" "$check")
        if [ "$got" != "$want" ]; then
            say "$path: sha256 $got from $url, expected $want: not used"
            rm -f "$PART"; continue
        fi
        mv -f "$PART" "$file" && done_one=1
        break
    done
    PART=""
    if [ $done_one -eq 1 ]; then fetched=$((fetched + 1)); else failed=$((failed + 1)); say "$path: NOT fetched"; fi
done <<EOF
$ASSETS
EOF

say "$DEST: $ok already present, $fetched downloaded, $failed failed"
if [ $failed -ne 0 ]; then
    say "some files could not be fetched (see above); the tests that need them report themselves skipped"
    exit 1
fi
say "done: run the tests with  KN_ASSETS=$DEST make test"

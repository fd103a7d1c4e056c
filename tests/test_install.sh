#!/bin/sh
# test_install.sh: `make install` into a temporary DESTDIR, then a small
# program compiled with the flags `pkg-config --cflags --libs kiln` gives,
# linked against the installed library both shared and static, and run.
# Then `make uninstall` must leave nothing behind.
#
# Run by `make test` (tests/run.sh), which passes this build's settings in the
# environment: BUILD, KN_CC, KN_SANFLAGS (and MAKEFLAGS, so the make below
# uses the same build directory and flags). Prints one line per test and
# "# totals: P F S" like the C test binaries.
. "$(dirname "$0")/kn_test.sh"    # ok, bad, skip, totals

BUILD=${BUILD:-build}
CC=${KN_CC:-cc}
MAKE=${MAKE:-make}
TESTS="install_layout pkgconfig_shared pkgconfig_static uninstall"

if ! command -v pkg-config >/dev/null 2>&1; then
    for t in $TESTS; do skip "$t" "pkg-config is not installed (apt-get install pkg-config)"; done
    totals
fi

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
root="$tmp/root"
PREFIX=/opt/kiln-test      # not /usr/local: nothing on the machine can be mixed in

if ! $MAKE --no-print-directory -s install DESTDIR="$root" PREFIX="$PREFIX" > "$tmp/install.log" 2>&1; then
    bad install_layout "make install failed: $(tail -n 3 "$tmp/install.log" | tr '\n' ' ')"
    for t in pkgconfig_shared pkgconfig_static uninstall; do skip "$t" "make install failed"; done
    totals
fi
lib="$root$PREFIX/lib"
missing=""
for f in bin/kiln lib/libkiln.a lib/libkiln.so lib/libkiln.so.0 lib/pkgconfig/kiln.pc \
         include/kiln/kiln.h include/kiln/kiln_base.h include/kiln/kiln_llm.h; do
    [ -e "$root$PREFIX/$f" ] || missing="$missing $f"
done
soname=$(readelf -d "$lib/libkiln.so" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
if [ -n "$missing" ]; then bad install_layout "missing under DESTDIR$PREFIX:$missing"
elif command -v readelf >/dev/null 2>&1 && [ "$soname" != libkiln.so.0 ]; then
    bad install_layout "libkiln.so has soname '$soname', want libkiln.so.0"
else ok install_layout; fi

# pkg-config sees the staged tree as if it were installed (the sysroot prefixes -I and -L)
export PKG_CONFIG_PATH="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$lib/pkgconfig"
cat > "$tmp/prog.c" <<'EOF'
#include <stdio.h>
#include "kiln.h"
/* 2x2 identity times [1 2; 3 4], read back: the library's lazy graph, planner
 * and default backend all run. */
int main(void) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    if (!ctx) return 1;
    int64_t s[2] = {2, 2};
    float a[4] = {1, 0, 0, 1}, b[4] = {1, 2, 3, 4}, c[4] = {0};
    kn_tensor *y = kn_matmul(ctx, kn_from_data(ctx, KN_F32, 2, s, a), kn_from_data(ctx, KN_F32, 2, s, b));
    if (!y || kn_tensor_read(y, c, KN_F32)) { fprintf(stderr, "%s\n", kn_last_error()); return 1; }
    printf("%g %g %g %g\n", c[0], c[1], c[2], c[3]);
    kn_ctx_free(ctx);
    return 0;
}
EOF

try() {  # NAME LINK-FLAGS...
    name=$1; shift
    # shellcheck disable=SC2086
    if ! $CC ${KN_SANFLAGS:-} $(pkg-config --cflags kiln) -o "$tmp/$name" "$tmp/prog.c" "$@" > "$tmp/$name.log" 2>&1; then
        bad "$name" "compile/link failed: $(head -n 3 "$tmp/$name.log" | tr '\n' ' ')"; return
    fi
    out=$(LD_LIBRARY_PATH="$lib" "$tmp/$name" 2>&1)
    if [ "$out" != "1 2 3 4" ]; then bad "$name" "printed '$out', want '1 2 3 4'"; return; fi
    if [ "$name" = pkgconfig_static ] && command -v readelf >/dev/null 2>&1 && readelf -d "$tmp/$name" | grep -q 'libkiln'; then
        bad "$name" "the static link still needs libkiln.so"; return
    fi
    if [ "$name" = pkgconfig_shared ] && command -v readelf >/dev/null 2>&1 && ! readelf -d "$tmp/$name" | grep -q 'libkiln.so.0'; then
        bad "$name" "the shared link does not record libkiln.so.0"; return
    fi
    ok "$name"
}
# shared: what `pkg-config --libs kiln` gives, as a user would write it
# shellcheck disable=SC2046
try pkgconfig_shared $(pkg-config --libs kiln)
# static: the archive by name, with the private libraries of --static
static_libs=$(pkg-config --static --libs kiln | sed 's/-lkiln\b/-l:libkiln.a/')
# shellcheck disable=SC2086
try pkgconfig_static $static_libs

if ! $MAKE --no-print-directory -s uninstall DESTDIR="$root" PREFIX="$PREFIX" > "$tmp/uninstall.log" 2>&1; then
    bad uninstall "make uninstall failed: $(tail -n 3 "$tmp/uninstall.log" | tr '\n' ' ')"
else
    left=$(find "$root" \( -type f -o -type l \) | sed "s|^$root||" | tr '\n' ' ')
    if [ -n "$left" ]; then bad uninstall "left behind: $left"; else ok uninstall; fi
fi
totals

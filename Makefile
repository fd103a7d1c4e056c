# kiln build.
#
#   make            CPU library (build/libkiln.a, build/libkiln.so), the kiln program, tests, benches
#   make test       build what the tests need and run the suite (ends with "N passed, N failed, N skipped")
#   make sanitize   the whole suite again under ASan + UBSan (build-san/)
#   make bench      benchmark tables (GEMM vs OpenBLAS when it is installed, bandwidth vs copy, ...)
#   make run        fetch the default model and generate text
#   make install    headers, libkiln.a/.so, kiln and kiln.pc under PREFIX (/usr/local); DESTDIR honoured
#   make uninstall  removes what make install put there
#   make CUDA=1     also build the CUDA backend (nvcc), in build-cuda/ (so build-cuda/kiln)
#   make AVX2ONLY=1 never compile AVX-512 files (for valgrind, which cannot run them)
#   make V=1        show every compiler command (default: one short line per file)
#
# Builds run in parallel (one job per core) unless -jN is given. Each build
# directory remembers the configuration it was built with (BUILD/config): when
# the compiler, flags or CUDA=0/1 change, everything in it is rebuilt instead
# of linking objects of two configurations together.
#
# SIMD code lives in files named *_avx2.c / *_avx512.c; only those files get the
# ISA flags, and the code picks a path at run time from cpuid (src/core/cpu.c),
# so one binary runs on any x86-64 machine.

# the one version, from include/kiln_base.h (KN_VERSION): the .so's name and kiln.pc
VERSION := $(shell sed -n 's/^\#define KN_VERSION "\(.*\)"/\1/p' include/kiln_base.h)
SOMAJOR := 0

# plain `make` builds everything (the stamp rules below would otherwise be the first goal)
.DEFAULT_GOAL := all

CUDA    ?= 0
ifeq ($(CUDA),1)
  BUILD ?= build-cuda
else
  BUILD ?= build
endif
CC      ?= cc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
# -fvisibility=hidden: libkiln.so exports only what include/*.h declares (those
# headers switch default visibility back on); tests/test_symbols.sh checks it
CFLAGS  += -std=c11 -Wall -Wextra -pedantic -Wno-unused-parameter -Wno-missing-field-initializers -fPIC -D_GNU_SOURCE \
           -Iinclude -Isrc -fvisibility=hidden $(SANFLAGS)
LDLIBS  += -lm -lpthread -lz
ARCH    := $(shell uname -m)

# One job per core unless the command line chose (-jN, -j1). Only the top-level
# make adds it: a sub-make shares its parent's job server.
ifeq ($(MAKELEVEL)$(filter -j% j%,$(MAKEFLAGS)),0)
  MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif

# Quiet by default: "  CC      src/core/ctx.c"; V=1 prints the commands, -s nothing.
ifeq ($(V),1)
  Q   :=
  say :=
else ifneq ($(findstring s,$(firstword -$(MAKEFLAGS))),)
  Q   := @
  say :=
else
  Q   := @
  say  = @printf '  %-7s %s\n' '$(1)' '$(2)';
endif

AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mfma -mf16c

SRC_ALL := $(shell find src -name '*.c' | sort)
ifneq ($(ARCH),x86_64)
  SRC_ALL := $(filter-out %_avx2.c %_avx512.c,$(SRC_ALL))
  CFLAGS  += -DKN_NO_X86
endif
ifeq ($(AVX2ONLY),1)
  SRC_ALL := $(filter-out %_avx512.c,$(SRC_ALL))
  CFLAGS  += -DKN_NO_AVX512
endif
SRC   := $(SRC_ALL)
OBJ   := $(SRC:%.c=$(BUILD)/%.o)

TEST_SRC  := $(sort $(wildcard tests/test_*.c))
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# script tests (README snippets, make install + pkg-config): same output format
TEST_SH   := $(sort $(wildcard tests/test_*.sh))
BENCH_SRC := $(sort $(wildcard bench/bench_*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
# bench_gemm is the only file that includes cblas.h (it compares against
# OpenBLAS and calls OpenBLAS's own functions): it alone links OpenBLAS, and is
# built only where a test program with cblas.h links against it (a cblas.h from
# the reference BLAS is not enough), so that `make` and `make test` need no
# BLAS; make bench says what is missing. Checked only for the goals that build it.
BLAS_LIBS ?= $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
ifneq ($(filter all bench $(BUILD)/bench/bench_gemm,$(or $(MAKECMDGOALS),all)),)
  HAVE_CBLAS := $(shell printf '\043include <cblas.h>\nchar *openblas_get_corename(void);\nint main(void) { float a = 1; cblas_sgemv(CblasRowMajor, CblasNoTrans, 1, 1, 1.0f, &a, 1, &a, 1, 0.0f, &a, 1); return !openblas_get_corename(); }\n' | \
                  $(CC) -x c - -o /dev/null $(BLAS_LIBS) >/dev/null 2>&1 && echo 1)
endif
ifneq ($(HAVE_CBLAS),1)
  BENCH_BIN := $(filter-out %/bench_gemm,$(BENCH_BIN))
endif

# ---- the kiln program ----------------------------------------------------------
TOOL_SRC  := $(sort $(wildcard tools/*.c tools/serve/*.c))
# the chat page of `kiln serve`, embedded as a C array (scripts/embed_page.py)
PAGE_OBJ  := $(BUILD)/gen/serve_page.o
TOOL_OBJ  := $(TOOL_SRC:%.c=$(BUILD)/%.o) $(PAGE_OBJ)
TOOL_DEFS :=
# libmicrohttpd (Debian: libmicrohttpd-dev): HTTP for `kiln serve`; only the
# program and test_serve link it, never the library
TOOL_LIBS := -lmicrohttpd
# what tests/test_serve.c links: the server's layers below HTTP and the engine
SERVE_CORE_OBJ := $(patsubst %,$(BUILD)/tools/serve/%.o,jw api handler metrics tools) $(PAGE_OBJ)
# libedit (Debian: libedit-dev), optional: line editing and history in
# `kiln chat`. Found by its header; EDITLINE=0 builds without it. Only the
# program links it, never the library.
# (printf's \043 is '#': make 4.3 keeps a backslash before '#' in $(shell ...), so
# `echo '\#include ...'` fed the compiler a line that is no directive and always
# "found" the header)
ifndef EDITLINE
  EDITLINE := $(shell printf '\043include <editline/readline.h>\n' | $(CC) -E -x c - >/dev/null 2>&1 && echo 1)
endif
ifeq ($(EDITLINE),1)
  TOOL_DEFS += -DKN_HAVE_EDITLINE
  TOOL_LIBS += -ledit
endif

# ---- CUDA (opt-in) -----------------------------------------------------------
ifeq ($(CUDA),1)
  NVCC      ?= nvcc
  CUDA_HOME ?= /usr/local/cuda
  NVCCFLAGS ?= -O3 -std=c++17 -Iinclude -Isrc -Xcompiler -fPIC,-fvisibility=hidden \
               -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=sm_90 \
               -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80
  CU_SRC    := $(shell find src -name '*.cu' | sort)
  CU_OBJ    := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
  OBJ       += $(CU_OBJ)
  CFLAGS    += -DKN_CUDA -I$(CUDA_HOME)/include
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lnvrtc -lstdc++
  LDLIBS    += $(CUDA_LIBS)
endif
# header dependencies (-MMD): an enum change in kiln.h must rebuild the kernels too
DEPS := $(OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_BIN:=.d)

# ---- build configuration stamps ----------------------------------------------
# BUILD/config holds every setting that changes what an object or a link
# contains; it is rewritten only when they differ, and everything built in
# BUILD depends on it. So `make CUDA=1 BUILD=build` after `make` rebuilds
# instead of mixing CUDA and CPU-only objects. BUILD/config-tools does the
# same for what only the kiln program sees (libedit on or off).
CONFIG_STAMP := $(BUILD)/config
TOOLS_STAMP  := $(BUILD)/config-tools
KN_CONFIG := CC=$(CC) CFLAGS=$(CFLAGS) AVX2=$(AVX2_FLAGS) AVX512=$(AVX512_FLAGS) CUDA=$(CUDA) \
             NVCC=$(NVCC) $(NVCCFLAGS) LDLIBS=$(LDLIBS)
write_stamp = $(shell mkdir -p $(BUILD) && { [ "$$(cat $(1) 2>/dev/null)" = '$(subst ','\'',$(2))' ] || \
                printf '%s\n' '$(subst ','\'',$(2))' > $(1); })
# (not under make -n, which must change nothing, nor for clean/uninstall)
ifeq ($(filter clean uninstall,$(MAKECMDGOALS))$(findstring n,$(firstword -$(MAKEFLAGS))),)
  $(call write_stamp,$(CONFIG_STAMP),$(KN_CONFIG))
  $(call write_stamp,$(TOOLS_STAMP),$(TOOL_DEFS) $(TOOL_LIBS))
endif
# written above; this empty rule only lets make -n plan a fresh directory
$(CONFIG_STAMP) $(TOOLS_STAMP): ;

.PHONY: all lib test tests sanitize bench run clean fuzz test-cuda bench-cuda valgrind install uninstall
all: lib $(BUILD)/kiln $(TEST_BIN) $(BENCH_BIN)
lib: $(BUILD)/libkiln.a $(BUILD)/libkiln.so
tests: lib $(BUILD)/kiln $(TEST_BIN)

$(BUILD)/%.o: %.c $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_avx2.o: %_avx2.c $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_avx512.o: %_avx512.c $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%.cu.o: %.cu $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<)$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@
$(TOOL_OBJ): CFLAGS += $(TOOL_DEFS)
$(TOOL_OBJ): $(TOOLS_STAMP)

$(BUILD)/gen/serve_page.c: tools/serve/page.html scripts/embed_page.py
	@mkdir -p $(dir $@)
	$(call say,GEN,$@)python3 scripts/embed_page.py $< $@
$(PAGE_OBJ): $(BUILD)/gen/serve_page.c $(CONFIG_STAMP)
	$(call say,CC,$<)$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libkiln.a: $(OBJ)
	@rm -f $@
	$(call say,AR,$@)ar rcs $@ $^
$(BUILD)/libkiln.so: $(OBJ)
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libkiln.so.$(SOMAJOR) $(SANFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/kiln: $(TOOL_OBJ) $(BUILD)/libkiln.a $(TOOLS_STAMP)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libkiln.a $(TOOL_LIBS) $(LDLIBS)
$(BUILD)/tests/%: tests/%.c tests/kn_test.h $(BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) -Itests -MMD -MP -o $@ $< $(BUILD)/libkiln.a $(TEST_LDFLAGS) $(LDLIBS)
$(BUILD)/tests/test_serve: tests/test_serve.c tests/kn_test.h $(SERVE_CORE_OBJ) $(BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) -Itests -Itools -MMD -MP -o $@ $< $(SERVE_CORE_OBJ) $(BUILD)/libkiln.a $(LDLIBS)
# allocation-failure injection: the test wraps the library's malloc/calloc/realloc
$(BUILD)/tests/test_plan_nomem: TEST_LDFLAGS = -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc
$(BUILD)/bench/%: bench/%.c $(BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libkiln.a $(LDLIBS)
$(BUILD)/bench/bench_gemm: bench/bench_gemm.c $(BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libkiln.a $(LDLIBS) $(BLAS_LIBS)

# Tests: each test binary prints its own results; tests/run.sh adds them up and
# prints the closing "N passed, N failed, N skipped" line. The script tests
# build small programs against this build (README snippets) and run
# `make install` into a temporary DESTDIR: they get the compiler, flags and
# libraries of this build from the environment. The '+' lets that make share
# this one's job server.
test: tests
	+@BUILD=$(BUILD) MAKE='$(MAKE)' KN_CC='$(CC)' KN_CFLAGS='$(CFLAGS)' KN_SANFLAGS='$(SANFLAGS)' KN_LDLIBS='$(LDLIBS)' \
	  sh tests/run.sh $(TEST_BIN) $(TEST_SH)

sanitize:
	$(MAKE) BUILD=build-san OPT=-O1 CC=clang \
	  SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	  KN_SANITIZE=1 test

# test_llm (SmolLM2 end to end) is left out: under valgrind it runs for over
# half an hour; its code paths are covered by the sanitizer build.
valgrind:
	$(MAKE) BUILD=build-avx2 AVX2ONLY=1 tests
	@for t in build-avx2/tests/test_*; do case $$t in *.d|*/test_llm|*/test_perplexity) continue;; esac; \
	  echo "valgrind $$t"; valgrind -q --error-exitcode=1 $$t >/dev/null || exit 1; done

# On a GPU machine: every op of the CUDA backend against the reference backend
# and every hand-tuned kernel against a CPU float64 reference (test-cuda), then
# the kernels timed next to cuBLAS and copy bandwidth (bench-cuda).
test-cuda:
	sh scripts/cuda_test.sh
	sh scripts/cuda_run.sh --tests
bench-cuda:
	sh scripts/cuda_run.sh

bench: lib $(BENCH_BIN)
	@[ "$(HAVE_CBLAS)" = 1 ] || echo "make bench: OpenBLAS not found (apt-get install libopenblas-dev): skipping the SGEMM comparison"
	@for b in $(BENCH_BIN); do $$b || exit 1; done

run: $(BUILD)/kiln
	@sh scripts/fetch_model.sh
	./$(BUILD)/kiln generate -m models/SmolLM2-135M-Instruct.Q4_1.gguf --chat \
	  -p "What is the capital of France?" -n 64 --temp 0

# ---- install -------------------------------------------------------------------
# Headers go to INCLUDEDIR/kiln (they include each other by plain names; the
# pkg-config file adds -I for that directory, so `#include "kiln.h"` works).
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL    ?= install
SONAME     := libkiln.so.$(SOMAJOR)
HEADERS    := $(sort $(wildcard include/*.h include/*.def))

install: lib $(BUILD)/kiln
	$(Q)$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/kiln $(DESTDIR)$(PKGCONFIGDIR)
	$(call say,INSTALL,$(DESTDIR)$(INCLUDEDIR)/kiln)$(INSTALL) -m 644 $(HEADERS) $(DESTDIR)$(INCLUDEDIR)/kiln/
	$(call say,INSTALL,$(DESTDIR)$(LIBDIR)/libkiln.a)$(INSTALL) -m 644 $(BUILD)/libkiln.a $(DESTDIR)$(LIBDIR)/libkiln.a
	$(call say,INSTALL,$(DESTDIR)$(LIBDIR)/libkiln.so.$(VERSION))$(INSTALL) -m 755 $(BUILD)/libkiln.so $(DESTDIR)$(LIBDIR)/libkiln.so.$(VERSION)
	$(Q)ln -sf libkiln.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	$(Q)ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libkiln.so
	$(call say,INSTALL,$(DESTDIR)$(BINDIR)/kiln)$(INSTALL) -m 755 $(BUILD)/kiln $(DESTDIR)$(BINDIR)/kiln
	$(call say,GEN,$(DESTDIR)$(PKGCONFIGDIR)/kiln.pc)sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	  -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@VERSION@|$(VERSION)|' \
	  -e 's|@LIBS_PRIVATE@|-lm -lpthread -lz $(CUDA_LIBS)|' -e 's|@CFLAGS@|$(if $(filter 1,$(CUDA)),-DKN_CUDA)|' \
	  -e 's/  *$$//' kiln.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/kiln.pc
	$(Q)if [ -z "$(DESTDIR)" ] && command -v ldconfig >/dev/null 2>&1; then ldconfig 2>/dev/null || true; fi

uninstall:
	$(call say,RM,$(DESTDIR)$(BINDIR)/kiln)rm -f $(DESTDIR)$(BINDIR)/kiln
	$(call say,RM,$(DESTDIR)$(LIBDIR)/libkiln.*)rm -f $(DESTDIR)$(LIBDIR)/libkiln.a $(DESTDIR)$(LIBDIR)/libkiln.so \
	  $(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libkiln.so.$(VERSION)
	$(call say,RM,$(DESTDIR)$(PKGCONFIGDIR)/kiln.pc)rm -f $(DESTDIR)$(PKGCONFIGDIR)/kiln.pc
	$(call say,RM,$(DESTDIR)$(INCLUDEDIR)/kiln)rm -f $(HEADERS:include/%=$(DESTDIR)$(INCLUDEDIR)/kiln/%)
	$(Q)rmdir $(DESTDIR)$(INCLUDEDIR)/kiln 2>/dev/null || true

clean:
	rm -rf build build-san build-avx2 build-cuda build-fuzz

-include $(DEPS)

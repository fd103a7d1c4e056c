# kiln build.
#
#   make            CPU library (build/libkiln.a, build/libkiln.so), the kiln program, tests, benches
#   make test       build and run the whole test suite (ends with "N passed, N failed, N skipped")
#   make sanitize   the whole suite again under ASan + UBSan (build-san/)
#   make bench      benchmark tables (GEMM vs OpenBLAS, bandwidth vs copy, ...)
#   make run        fetch the default model and generate text
#   make CUDA=1     also build the CUDA backend (nvcc)
#   make AVX2ONLY=1 never compile AVX-512 files (for valgrind, which cannot run them)
#
# SIMD code lives in files named *_avx2.c / *_avx512.c; only those files get the
# ISA flags, and the code picks a path at run time from cpuid (src/core/cpu.c),
# so one binary runs on any x86-64 machine.

BUILD   ?= build
CC      ?= cc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -Wall -Wextra -pedantic -Wno-unused-parameter -Wno-missing-field-initializers -fPIC -D_GNU_SOURCE \
           -Iinclude -Isrc $(SANFLAGS)
LDLIBS  += -lm -lpthread -lz
ARCH    := $(shell uname -m)

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
DEPS  := $(OBJ:.o=.d)

TEST_SRC  := $(sort $(wildcard tests/test_*.c))
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(sort $(wildcard bench/bench_*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
# bench_gemm compares against OpenBLAS: built only where cblas.h is found, so
# that `make` and `make test` need no BLAS (make bench says what is missing)
HAVE_CBLAS := $(shell echo '\#include <cblas.h>' | $(CC) -E -x c - >/dev/null 2>&1 && echo 1)
ifneq ($(HAVE_CBLAS),1)
  BENCH_BIN := $(filter-out %/bench_gemm,$(BENCH_BIN))
endif
TOOL_SRC  := $(sort $(wildcard tools/*.c))

# ---- CUDA (opt-in) -----------------------------------------------------------
ifeq ($(CUDA),1)
  NVCC      ?= nvcc
  CUDA_HOME ?= /usr/local/cuda
  NVCCFLAGS ?= -O3 -std=c++17 -Iinclude -Isrc -Xcompiler -fPIC \
               -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=sm_90 \
               -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80
  CU_SRC    := $(shell find src -name '*.cu' | sort)
  CU_OBJ    := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
  OBJ       += $(CU_OBJ)
  DEPS      += $(CU_OBJ:.o=.d)    # header dependencies: an enum change in kiln.h must rebuild the kernels
  CFLAGS    += -DKN_CUDA -I$(CUDA_HOME)/include
  LDLIBS    += -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++
endif

.PHONY: all lib test sanitize bench run clean fuzz test-cuda bench-cuda valgrind
all: lib $(BUILD)/kiln $(TEST_BIN) $(BENCH_BIN)
lib: $(BUILD)/libkiln.a $(BUILD)/libkiln.so

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libkiln.a: $(OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libkiln.so: $(OBJ)
	$(CC) -shared $(SANFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/kiln: $(TOOL_SRC) $(BUILD)/libkiln.a
	$(CC) $(CFLAGS) -o $@ $(TOOL_SRC) $(BUILD)/libkiln.a $(LDLIBS)
$(BUILD)/tests/%: tests/%.c tests/kn_test.h $(BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libkiln.a $(LDLIBS)
$(BUILD)/bench/%: bench/%.c $(BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libkiln.a $(LDLIBS) $(BENCH_LIBS)

# Tests: each test binary prints its own results; tests/run.sh adds them up and
# prints the closing "N passed, N failed, N skipped" line.
test: all
	@BUILD=$(BUILD) sh tests/run.sh $(TEST_BIN)

sanitize:
	$(MAKE) BUILD=build-san OPT=-O1 CC=clang \
	  SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	  KN_SANITIZE=1 test

# test_llm (SmolLM2 end to end) is left out: under valgrind it runs for over
# half an hour; its code paths are covered by the sanitizer build.
valgrind:
	$(MAKE) BUILD=build-avx2 AVX2ONLY=1 all
	@for t in build-avx2/tests/test_*; do case $$t in *.d|*/test_llm) continue;; esac; \
	  echo "valgrind $$t"; valgrind -q --error-exitcode=1 $$t >/dev/null || exit 1; done

# On a GPU machine: every op of the CUDA backend against the reference backend
# and every hand-tuned kernel against a CPU float64 reference (test-cuda), then
# the kernels timed next to cuBLAS and copy bandwidth (bench-cuda).
test-cuda:
	sh scripts/cuda_test.sh
	sh scripts/cuda_run.sh --tests
bench-cuda:
	sh scripts/cuda_run.sh

BENCH_LIBS ?= $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
bench: all
	@[ "$(HAVE_CBLAS)" = 1 ] || echo "make bench: OpenBLAS not found (apt-get install libopenblas-dev): skipping the SGEMM comparison"
	@for b in $(BENCH_BIN); do $$b || exit 1; done

run: $(BUILD)/kiln
	@sh scripts/fetch_model.sh
	./$(BUILD)/kiln generate -m models/SmolLM2-135M-Instruct.Q4_1.gguf --chat \
	  -p "What is the capital of France?" -n 64 --temp 0

clean:
	rm -rf build build-san build-avx2 build-cuda build-fuzz

-include $(DEPS)

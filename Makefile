# Front door: `make demo`, `make test`, `make bench`. Each installs what is
# missing (scripts/setup.sh), configures and builds with CMake.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
ifeq ($(CI),true)
CMAKE_FLAGS += -DPARADEV_WERROR=ON
endif

.PHONY: all setup build venv demo test test-sanitize bench fuzz format clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The Python venv the tests use for what Debian lacks (safetensors, pinned):
# $(BUILD)/venv, from /usr/bin/python3 with Debian's numpy. ctest's
# setup.python_venv fixture runs the same script, so a bare ctest works too.
venv: build
	@bash scripts/venv.sh $(BUILD)/venv

# The main example against a daemon on the CPU backend (see README).
demo: build
	@bash scripts/demo.sh $(BUILD)

# Every test, then every test again under AddressSanitizer + UBSan.
test: build venv
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300
	@$(MAKE) --no-print-directory test-sanitize

test-sanitize: setup
	@cmake -S . -B $(BUILD)-sanitize -DCMAKE_BUILD_TYPE=Debug -DPARADEV_SANITIZE=ON -DPARADEV_VENV=$(abspath $(BUILD))/venv $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD)-sanitize -j $(JOBS)
	@cd $(BUILD)-sanitize && ctest --output-on-failure -j $(JOBS) --timeout 600

bench: build venv
	@bash scripts/bench.sh $(BUILD)

# The libFuzzer targets (tests/fuzz/README.md), built with clang under
# ASan + UBSan in build-fuzz/, FUZZ_SECONDS each (default 60); FUZZ_JOBS
# processes per target; `make fuzz FUZZ_TARGETS=fuzz_config` for one.
fuzz: setup
	@bash scripts/fuzz.sh $(FUZZ_TARGETS)

# clang-format (.clang-format) over the tracked .c and .h files, in place;
# scripts/format.sh --check only lists what would change.
format:
	@bash scripts/format.sh

clean:
	rm -rf $(BUILD) $(BUILD)-sanitize build-fuzz

# ddprun's front door.
#   make        configure and build into build/ (executables in build/bin/)
#   make test   install missing Debian packages, build, run every test tier
#   make demo   install missing packages, build, run a 4-worker job
# Knobs: BUILD_DIR, BUILD_TYPE, JOBS (default 2: the build machines are small).
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= 2
CTEST_ARGS ?=

.PHONY: all build configure deps test test-unit demo clean

all: build

configure: $(BUILD_DIR)/CMakeCache.txt

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

deps:
	bash scripts/install-deps.sh

test: deps
	$(MAKE) --no-print-directory build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS) $(CTEST_ARGS)

# The fast tier only.
test-unit: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS) -L unit

demo: deps
	$(MAKE) --no-print-directory build
	$(BUILD_DIR)/bin/ddprun --nproc_per_node=4 examples/hello.sh

clean:
	rm -rf $(BUILD_DIR)

# ddprun's front door.
#   make        configure and build into build/ (executables in build/bin/)
#   make test   install missing Debian packages, build, run every test tier
#   make demo   install only the build packages, build only ddprun (no tests, no
#               benchmarks, no gRPC module; in DEMO_BUILD_DIR), run a 4-worker job
#   make product  ddprun, ddprund, the gRPC module and the SDK (DEMO_BUILD_DIR)
#   make wheel  dist/ddprun-<version>-py3-none-<platform>.whl (docs/install.md)
#   make deb    dist/ddprun_<version>_amd64.deb with CPack (docs/install.md)
# Knobs: BUILD_DIR, BUILD_TYPE, JOBS (default 2: the build machines are small),
# DEMO_BUILD_DIR and DEMO_BUILD_FLAGS (the product tree of demo, wheel and deb).
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= 2
CTEST_ARGS ?=
# The product alone: what make product, make wheel and make deb build (make demo: ddprun only).
DEMO_BUILD_DIR ?= build-demo
PRODUCT_TARGETS = ddprun ddprund ddprun_grpc ddprun_worker_sdk ddprun-bench-worker

.PHONY: all build configure deps deps-build product demo-build test test-unit demo wheel deb clean

all: build

configure: $(BUILD_DIR)/CMakeCache.txt

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

deps:
	bash scripts/install-deps.sh

deps-build:
	bash scripts/install-deps.sh --build

# Prefix /usr: the tree the .deb packs (with the ddprund unit and /etc/ddprun). The code of
# RelWithDebInfo (-O2) without its -g: the wheel and the .deb strip debug information anyway,
# and it is about a tenth of the compile time (scripts/time-fresh-demo.sh, README).
DEMO_BUILD_FLAGS ?= -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG"
$(DEMO_BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(DEMO_BUILD_DIR) $(DEMO_BUILD_FLAGS) -DCMAKE_INSTALL_PREFIX=/usr \
	  -DDDPRUN_BUILD_TESTS=OFF -DDDPRUN_BUILD_BENCH=OFF -DDDPRUN_LAUNCHER_COMPANIONS=OFF

product: deps-build $(DEMO_BUILD_DIR)/CMakeCache.txt
	cmake --build $(DEMO_BUILD_DIR) -j$(JOBS) --target $(PRODUCT_TARGETS)

test: deps
	$(MAKE) --no-print-directory build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS) $(CTEST_ARGS)

# The fast tier only.
test-unit: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS) -L unit

# The demo's single-node job runs bin/ddprun alone: it never loads the gRPC module, and the
# module (protobuf, gRPC), ddprund, the SDK and the bench worker are most of the product's
# compile (README).
demo-build: deps-build $(DEMO_BUILD_DIR)/CMakeCache.txt
	cmake --build $(DEMO_BUILD_DIR) -j$(JOBS) --target ddprun

demo: demo-build
	$(DEMO_BUILD_DIR)/bin/ddprun --nproc_per_node=4 examples/hello.sh

wheel: product
	python3 scripts/packaging/build_wheel.py --build $(DEMO_BUILD_DIR) --out dist

deb: product
	cmake --build $(DEMO_BUILD_DIR) -j$(JOBS) --target ddprun_package_files
	cd $(DEMO_BUILD_DIR) && cpack -G DEB -B $(CURDIR)/dist

clean:
	rm -rf $(BUILD_DIR) $(DEMO_BUILD_DIR) dist

# The two commands a newcomer runs: `make demo` and `make test`. Builds use CMakePresets.json.
.PHONY: demo test deps release asan tsan clean

JOBS ?= $(shell nproc)
# Debian's interpreter, which has Debian's NumPy, PyTorch and pytest (whatever python3 is on PATH).
PYTHON ?= /usr/bin/python3

deps:
	@./scripts/install-deps.sh

release: deps
	@cmake --preset release >/dev/null
	@cmake --build build/release -j $(JOBS)

# The asan-ubsan preset compiles with clang (about half of g++'s time for this build) and -g1:
# line tables, all a sanitizer stack trace needs for file:line (with g++, -g took 15% longer).
asan: deps
	@cmake --preset asan-ubsan >/dev/null
	@cmake --build build/asan -j $(JOBS) --target argus_tests argus

# The store's tests under ThreadSanitizer: core and store sources only (see TSAN-SECTION).
tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build build/tsan -j $(JOBS) --target argus_store_tsan_tests

# The default demonstration: a 32K-token decode step on Llama-3-8B geometry with the KV cache in
# three codec mixes, side by side with f16 (memory, time, error; about 20 s).
demo: release
	@./build/release/argus demo

# The whole suite, the Python package's tests, then the suite again under AddressSanitizer +
# UndefinedBehaviorSanitizer (all but argus-bench's tests: the sanitizers check the runtime, not
# the measuring ground), then the store's tests under ThreadSanitizer. The remote tier's tests
# start and stop redis-servers of their own (deps installs it); here they fail instead of skipping.
# ctest runs one process more than the cores: many tests wait on fsync, Redis or a child program.
test: release asan tsan
	@cd build/release && ARGUS_REQUIRE_REDIS=1 ctest --output-on-failure -j $$(( $(JOBS) + 1 ))
	@$(PYTHON) -m pytest -q -p no:cacheprovider tests/python
	@cd build/asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ARGUS_REQUIRE_REDIS=1 ctest --output-on-failure -j $$(( $(JOBS) + 1 ))
	@TSAN_OPTIONS=halt_on_error=1 ./build/tsan/argus_store_tsan_tests

clean:
	rm -rf build

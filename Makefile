# The two commands a newcomer runs: `make demo` and `make test`. Builds use CMakePresets.json.
.PHONY: demo test deps release asan clean

JOBS ?= $(shell nproc)

deps:
	@./scripts/install-deps.sh

release: deps
	@cmake --preset release >/dev/null
	@cmake --build build/release -j $(JOBS)

asan: deps
	@cmake --preset asan-ubsan >/dev/null
	@cmake --build build/asan -j $(JOBS) --target argus_tests argus

# The default demonstration: a 32K-token decode step on Llama-3-8B geometry with the KV cache in
# three codec mixes, side by side with f16 (memory, time, error; about 20 s).
demo: release
	@./build/release/argus demo

# The whole suite, then the whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
test: release asan
	@cd build/release && ctest --output-on-failure -j $(JOBS)
	@cd build/asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf build

# The two commands a newcomer runs: `make demo` and `make test`. Everything else is detail.
.PHONY: demo test deps release asan clean

GEN := -G Ninja
JOBS ?= $(shell nproc)

deps:
	@./scripts/install-deps.sh

release: deps
	@cmake -S . -B build/release $(GEN) -DCMAKE_BUILD_TYPE=Release -DARGUS_WERROR=ON >/dev/null
	@cmake --build build/release -j $(JOBS)

asan: deps
	@cmake -S . -B build/asan $(GEN) -DCMAKE_BUILD_TYPE=Debug -DARGUS_SANITIZE=ON -DARGUS_WERROR=ON \
	  -DARGUS_BUILD_BENCH=OFF >/dev/null
	@cmake --build build/asan -j $(JOBS) --target argus_tests argus

# The default demonstration: machine probes, the codec table, and every codec measured side by
# side against f16 on synthetic KV (about a minute).
demo: release
	@./build/release/argus demo

# The whole suite, then the whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
test: release asan
	@cd build/release && ctest --output-on-failure -j $(JOBS)
	@cd build/asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf build

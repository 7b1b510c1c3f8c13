#!/usr/bin/env bash
# Installs every Debian package the ARGUS build, tests and benchmarks need, and nothing else.
# Safe to run repeatedly: packages already present are skipped.
set -euo pipefail

packages=(
  cmake ninja-build g++           # toolchain of the Release and Debug builds
  clang libclang-rt-dev           # toolchain of the sanitizer and fuzz builds, and their runtimes
  libgtest-dev libgmock-dev       # unit tests
  libbenchmark-dev                # microbenchmarks
  libxxhash-dev                   # XXH3 checksums
  libcli11-dev                    # command-line parsing
  nlohmann-json3-dev              # JSON output of benchmarks
  libfmt-dev                      # formatting of tables and messages
  libzstd-dev                     # entropy coder of the lossless codec's exponent stream
  libpcre2-dev                    # Unicode regular expressions of BPE pre-tokenizers
  liburing-dev                    # asynchronous disk reads (io_uring)
  fio                             # the denominator of `argus-bench store`
  libhiredis-dev                  # Redis client of the remote tier (--remote redis://…)
  libcpp-httplib-dev              # HTTP server of argus serve, and the client of its tests
  redis-server                    # the Redis server the remote tier's tests and benchmark start
  python3-numpy python3-torch     # the Python package and its tests (argus.torch)
  python3-pytest python3-pip      # its test runner; pip installs it offline in a test
  python3-matplotlib              # scripts/plot_bench.py: benchmark reports as SVG
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present" >&2
  exit 0
fi
echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

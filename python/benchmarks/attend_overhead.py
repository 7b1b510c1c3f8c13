"""Decode attention through the Python package beside the same call through the C++ API, in one
run: one Llama-3-8B layer (32 query heads, 8 KV heads, head_dim 128), one thread, at 16, 4K and 32K
tokens, f16 and q4_0 pages. The C++ figures come from argus_microbench (BM_DecodeAttention),
run by this script. Prints JSON: per point the medians and the package's overhead per call.

    /usr/bin/python3 python/benchmarks/attend_overhead.py [--microbench build/release/argus_microbench]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import argus  # noqa: E402

N_Q, N_KV, D = 32, 8, 128


class PackagePoint:
    """A cache at one depth and codec, built once, timed through the package."""

    def __init__(self, codec, n_tokens, as_torch):
        rng = np.random.default_rng(1)
        self.cache = argus.KvCache(1, N_Q, N_KV, D, codec, codec, threads=1)
        self.seq = self.cache.create_sequence()
        for first in range(0, n_tokens, 4096):
            n = min(4096, n_tokens - first)
            self.cache.append(self.seq, 0, rng.standard_normal((n, N_KV, D), dtype=np.float32),
                              rng.standard_normal((n, N_KV, D), dtype=np.float32))
        self.q = rng.standard_normal((N_Q, D), dtype=np.float32)
        if as_torch:
            import torch
            self.q = torch.from_numpy(self.q)

    def median_us(self, repeats):
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            self.cache.attend(self.seq, 0, self.q)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:]) * 1e6


def cpp_medians_us(microbench, repeats):
    out = subprocess.run([microbench, "--benchmark_filter=BM_DecodeAttention",
                          f"--benchmark_repetitions={repeats}", "--benchmark_format=json",
                          "--benchmark_report_aggregates_only=true"],
                         capture_output=True, check=True, text=True).stdout
    medians = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            _, codec, tokens = b["run_name"].split("/")
            medians[(codec, int(tokens))] = b["real_time"]  # microseconds
    return medians


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbench", default=str(ROOT / "build/release/argus_microbench"))
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # Rounds alternate the two sides, so drift in the machine's speed reaches both alike; each
    # point's ratio is the median of its rounds' ratios.
    rounds = [cpp_medians_us(args.microbench, 3)]
    package = {(codec, tokens, as_torch): PackagePoint(codec, tokens, as_torch)
               for codec, tokens in rounds[0] for as_torch in (False, True)}
    py_rounds = []
    for r in range(args.rounds):
        if r > 0:
            rounds.append(cpp_medians_us(args.microbench, 3))
        py_rounds.append({key: point.median_us(args.repeats) for key, point in package.items()})
    points = []
    for (codec, tokens, as_torch) in sorted(package):
        cpp_us = [c[(codec, tokens)] for c in rounds]
        py_us = [p[(codec, tokens, as_torch)] for p in py_rounds]
        ratios = [p / c for p, c in zip(py_us, cpp_us)]
        points.append({"codec": codec, "tokens": tokens, "input": "torch" if as_torch else "numpy",
                       "cpp_us": [round(x, 1) for x in cpp_us],
                       "python_us": [round(x, 1) for x in py_us],
                       "ratio_median": round(statistics.median(ratios), 3),
                       "overhead_us_median": round(statistics.median(
                           [p - c for p, c in zip(py_us, cpp_us)]), 1)})
    print(json.dumps({"benchmark": "python attend overhead", "geometry": "llama-3-8b layer",
                      "threads": 1, "rounds": args.rounds, "points": points}, indent=1))


if __name__ == "__main__":
    main()

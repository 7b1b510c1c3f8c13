#!/usr/bin/env python3
"""The placement profiles on a trace recorded from a trained model, beside synthetic traces.

Records a trace of stories-distill-3M over its held-out text (`argus trace record`), generates
the synthetic recency and recall traces of the same geometry and lengths (`argus trace
generate`), and replays each through every profile at fractions of the exact cache's RAM
(`argus replay --json`), in one run on one machine. Writes every figure to a JSON file and prints
the table of docs/traces.md.

    scripts/replay_table.py --json docs/results/replay-distill-DATE.json

The profiles run with pins of 4 sink and 16 recent tokens and pages of 16 tokens, as in
docs/eval.md: the built-ins pin the last 256 tokens, most of a 512-token trace.
"""
import argparse
import json
import os
import tempfile

from report_common import log, pinned_profile, run, write_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
PROFILES = ["exact", "balanced", "research", "capacity"]
FRACTIONS = [0.5, 0.25, 0.1]
SYNTHETIC = ["recency", "recall"]


def make_traces(args, scratch):
    traces = {}
    recorded = os.path.join(scratch, "recorded.trace")
    run([args.argus, "trace", "record", "-m", args.model, "-f", args.text, "--prefix-tokens",
         str(args.prefix_tokens), "--steps", str(args.steps), "-t", str(args.threads),
         "-o", recorded])
    traces["recorded"] = recorded
    info = json.loads(run([args.argus, "trace", "info", recorded, "--json"]))
    g = info["geometry"]
    geometry = f"{g['layers']},{g['q_heads']},{g['kv_heads']},{g['head_dim']}"
    for kind in SYNTHETIC:
        path = os.path.join(scratch, f"{kind}.trace")
        run([args.argus, "trace", "generate", "--kind", kind, "--geometry", geometry,
             "--prefix-tokens", str(args.prefix_tokens), "--steps", str(args.steps),
             "-o", path])
        traces[kind] = path
    return traces


def replay(args, trace, profile, budget, scratch):
    disk = tempfile.mkdtemp(dir=scratch)
    return json.loads(run([args.argus, "replay", trace, "--profile", profile, "--ram-budget",
                           str(budget), "--disk-dir", disk, "--page-tokens",
                           str(args.page_tokens), "-t", str(args.threads), "--json"]))


def table(report):
    lines = ["| trace | profile | RAM | mean rel. error | max rel. error | bits per value in RAM "
             "| pages per state | time vs exact in RAM |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for row in report["rows"]:
        r = row["replay"]
        lines.append(f"| {row['trace']} | {row['profile']} | {row['fraction']:.0%} "
                     f"| {r['mean_rel_error']:.2%} | {r['max_rel_error']:.2%} "
                     f"| {r['effective_bits_per_value']:.2f} | {r['pages_per_state']} "
                     f"| {r['time_vs_exact_ram']:.1f}x |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--argus", default=os.path.join(ROOT, "build", "release", "argus"))
    parser.add_argument("--model", default=os.path.join(SHARED, "models",
                                                         "stories-distill-3M.gguf"))
    parser.add_argument("--text", default=os.path.join(SHARED, "models",
                                                        "stories-distill-heldout.txt"))
    parser.add_argument("--prefix-tokens", type=int, default=448)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--page-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        traces = make_traces(args, scratch)
        report = {"model": os.path.basename(args.model), "prefix_tokens": args.prefix_tokens,
                  "steps": args.steps, "page_tokens": args.page_tokens, "rows": []}
        for name, path in traces.items():
            exact_bytes = None
            for base in PROFILES:
                profile = pinned_profile(base, scratch)
                for fraction in FRACTIONS:
                    if exact_bytes is None:
                        exact_bytes = replay(args, path, profile, 1 << 40, scratch)["exact_bytes"]
                    budget = int(exact_bytes * fraction)
                    log(f"{name}: {base} at {fraction:.0%} of {exact_bytes} bytes")
                    row = {"trace": name, "profile": base, "fraction": fraction,
                           "ram_budget_bytes": budget}
                    try:
                        row["replay"] = replay(args, path, profile, budget, scratch)
                    except SystemExit as failure:  # a budget the profile cannot meet is a finding
                        log(str(failure))
                        continue
                    report["rows"].append(row)
    if args.json:
        write_report(report, args.json, indent=1)
    print(table(report))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The capacity frontier: `argus-bench capacity` over placement ladders, disk time shares and RAM
budgets, one run each, in one sitting on one machine.

    scripts/capacity_frontier.py --dir /path/on/the/disk --json docs/results/capacity-frontier-DATE.json
    scripts/plot_bench.py docs/results/capacity-frontier-DATE.json -o docs/results/capacity-frontier-DATE.svg

Each point is a long context (Llama-3-8B geometry, 256K tokens by default, --layers of them)
under a RAM budget that is a fraction of its exact f16 KV, the rest on disk, decoded through the
placement engine; beside it the same bench's 32K context all in RAM. The report keeps every run's
report and prints the table of docs/benchmarks.md: mean and max attention error, the
rate-distortion bound's error at the bits per value the run holds in RAM (the same rate on every
token, and the bits spent where attention falls), disk bytes per token, time per token over the
all-in-RAM run's, needle found.
"""
import argparse
import json
import os
import tempfile
import time

from report_common import log, run, write_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Ladders: the built-in `exact` (f16 in RAM, the rest read from disk at every step: no error; it
# has no sketch state, so it runs at the first share only), the built-in `capacity`, and
# `capacity` with the 3- and 2-bit codecs of docs/codecs.md in place of its int4 and int2 rungs
# and the same 1-bit last rung.
LADDERS = {
    "exact": None,
    "capacity": None,
    "capacity-lowbit": [{"k": "f16", "v": "f16"}, {"k": "chan3", "v": "nl3"},
                        {"k": "chan2", "v": "nl2"}, {"k": "int1", "v": "plane8/2"},
                        {"tier": "disk"}],
}


def profile_path(name, scratch):
    ladder = LADDERS[name]
    if ladder is None:
        return name
    path = os.path.join(scratch, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"name": name, "base": "capacity", "ladder": ladder}, f)
    return path


def run_point(args, scratch, ladder, fraction, share):
    out = os.path.join(scratch, "point.json")
    command = [args.bench, "capacity", "--dir", args.dir, "--model", args.model,
               "--layers", str(args.layers), "--tokens", str(args.tokens),
               "--ram-fraction", str(fraction), "--profile", profile_path(ladder, scratch),
               "--disk-time-share", str(share), "--steps", str(args.steps),
               "-t", str(args.threads), "--json", out]
    run(command)
    with open(out) as f:
        return json.load(f)


def markdown(report):
    lines = ["| RAM | ladder | disk time share | bits per value in RAM | pages per state | "
             "disk MB / token | time / all in RAM | mean error | bound, same rate a token | "
             "bound, bits by attention | max error | needle |",
             "| ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    order = list(LADDERS)
    for point in sorted(report["points"], key=lambda p: (-p["ram_fraction"], order.index(
            p["ladder"]), p["report"]["config"]["disk_time_share"])):
        c, run = point["report"]["config"], point["report"]["long"]
        lines.append(
            f"| {point['ram_fraction']:.1%} | {point['ladder']} | {c['disk_time_share']:.2f} | "
            f"{run['effective_bits_per_value']:.2f} | "
            f"{'/'.join(str(n) for n in run['pages_per_state'])} | "
            f"{run['disk_bytes_per_token'] / 1e6:.1f} | {point['report']['time_ratio']:.2f} | "
            f"{run['mean_rel_error']:.1e} | {run['rate_distortion']['uniform_rel_error']:.1e} | "
            f"{run['rate_distortion']['by_attention_rel_error']:.1e} | {run['max_rel_error']:.1e} | "
            f"{run['needle_found']}/{run['needle_steps']} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", default=os.path.join(ROOT, "build/release/argus-bench"))
    parser.add_argument("--argus", default=os.path.join(ROOT, "build/release/argus"))
    parser.add_argument("--dir", required=True, help="directory for the disk tier")
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--layers", type=int, default=4,
                        help="layers of the geometry (each layer alike: fewer make a point cheaper)")
    parser.add_argument("--tokens", type=int, default=262144)
    parser.add_argument("--fractions", default="0.25,0.125",
                        help="RAM budgets as fractions of the long context's exact KV")
    parser.add_argument("--ladders", default=",".join(LADDERS), help=f"of {', '.join(LADDERS)}")
    parser.add_argument("--add-to", help="a report of this script to add the points to")
    parser.add_argument("--shares", default="0,0.333,1", help="disk time shares")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", required=True, help="where the report goes")
    args = parser.parse_args()
    ladders = args.ladders.split(",")
    for name in ladders:
        if name not in LADDERS:
            raise SystemExit(f"unknown ladder '{name}' (known: {', '.join(LADDERS)})")
    fractions = [float(x) for x in args.fractions.split(",")]
    shares = [float(x) for x in args.shares.split(",")]
    started = time.time()
    if args.add_to:
        with open(args.add_to) as f:
            report = json.load(f)
    else:
        report = {"bench": "capacity-frontier", "date": time.strftime("%Y-%m-%d"),
                  "machine": json.loads(run([args.argus, "info", "--json"])),
                  "threads": args.threads, "points": []}
    total = len(fractions) * sum(1 if name == "exact" else len(shares) for name in ladders)
    done = 0
    with tempfile.TemporaryDirectory(prefix="argus-frontier-") as scratch:
        for fraction in fractions:
            for ladder in ladders:
                for share in shares[:1] if ladder == "exact" else shares:
                    done += 1
                    log(f"[{done}/{total}] {ladder} at {fraction:.1%} RAM, "
                        f"disk time share {share}")
                    point = run_point(args, scratch, ladder, fraction, share)
                    report["points"].append({"ram_fraction": fraction, "ladder": ladder,
                                             "report": point})
    report["seconds"] = report.get("seconds", 0) + time.time() - started
    write_report(report, args.json)
    print(markdown(report))


if __name__ == "__main__":
    main()

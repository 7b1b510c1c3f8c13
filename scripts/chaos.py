#!/usr/bin/env python3
"""The standing chaos run of the store and the prompt cache (issue 23). Writes one JSON file.

Two campaigns, each followed, cut after cut and kill after kill, by a check:

1. Power cuts (simulated): argus_tests' Chaos.PowerCuts* runs a prompt cache's life (prompt-cache
   writes through KvCache::StorePrefix, placement migrations of the exact profile with masters on
   disk, a journal compaction) on the fault Env's power-loss model, cut at its sync points with
   seeded loss and tearing of unsynced writes; after each cut it recovers the store twice and
   counts lost pages (Check), durable prefixes that no longer load, and outputs that differ from
   a run without a cache.

2. SIGKILLs (real): `argus run --prompt-cache DIR` child processes over a pool of prompts of
   stories260K (pages of 16 tokens), killed half at a random moment of their run, half while
   they store their pages (within 2 ms of the first byte they add to the store's files). After
   each kill: `argus store check` must find no lost page and every page stored before, and a
   full run of the same prompt with the cache must print exactly what a run without a cache
   prints. A new, empty cache every 25 kills keeps the killed runs storing.

Usage: scripts/chaos.py [--build build/release] [--cuts 1000] [--kills 200] [--json FILE]
Progress goes to stderr. Exit status 1 when any check failed.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def power_cuts(build, n_cuts, seed):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = dict(os.environ, ARGUS_CHAOS_CUTS=str(n_cuts), ARGUS_CHAOS_JSON=out,
               ARGUS_TEST_SEED=str(seed))
    # The power cut is simulated (the fault Env rebuilds the files), so the real fsyncs the
    # store makes buy nothing here: a tmpfs makes them free.
    if os.path.isdir("/dev/shm"):
        env["TMPDIR"] = "/dev/shm"
    t0 = time.time()
    log(f"power cuts: {n_cuts} (argus_tests --gtest_filter=Chaos.PowerCuts*)")
    r = subprocess.run([os.path.join(build, "argus_tests"), "--gtest_filter=Chaos.PowerCuts*"],
                       env=env, capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("chaos power cuts") or "Failure" in line or "FAILED" in line:
            log("  " + line)
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    result["test_passed"] = r.returncode == 0
    result["seconds"] = round(time.time() - t0, 1)
    return result


class Kills:
    def __init__(self, argus, model, workdir, rng):
        self.argus, self.model, self.rng = argus, model, rng
        self.workdir = workdir
        self.cache = os.path.join(workdir, "prompt-cache-0")
        self.prompt_path = os.path.join(workdir, "prompt.txt")
        with open(os.path.join(ROOT, "tests/data/story.txt")) as f:
            self.story = f.read()
        self.reference = {}  # prompt -> output without a cache

    def argv(self, cache, prompt_file, stats=False):
        a = [self.argus, "run", "-m", self.model, "-f", prompt_file, "--page-tokens", "16",
             "-n", "6", "--temp", "1.0", "--seed", "5"]
        if cache:
            a += ["--prompt-cache", self.cache]
        if stats:
            a.append("--stats")
        return a

    def prompt(self, text=None):
        # Prompts share starts (so later runs reuse earlier pages) and differ in their tails, so
        # most runs have new pages to store.
        if text is None:
            start = self.rng.choice([0, 0, 0, 220, 220, 900, 1500, 2400])
            text = self.story[start:start + self.rng.randrange(250, 900)]
        with open(self.prompt_path, "w") as f:
            f.write(text)
        return text

    def run(self, cache, stats=False):
        t = time.time()
        r = subprocess.run(self.argv(cache, self.prompt_path, stats), capture_output=True,
                           text=True)
        self.last_s = time.time() - t
        if r.returncode != 0:
            raise RuntimeError(f"argus run exited {r.returncode}: {r.stderr[-2000:]}")
        return r

    def store_bytes(self):
        total = 0
        try:
            for name in os.listdir(self.cache):
                if name.startswith("slots-") or name == "journal":
                    total += os.stat(os.path.join(self.cache, name)).st_size
        except FileNotFoundError:
            pass
        return total

    def check_store(self):
        if not os.path.exists(self.cache):  # killed before it created the cache: nothing stored
            return {"ok": True, "pages": 0, "lost_pages": 0}
        r = subprocess.run([self.argus, "store", "check", self.cache, "--json"],
                           capture_output=True, text=True)
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError:
            return {"ok": False, "pages": 0, "lost_pages": -1, "error": r.stderr[-500:]}

    def campaign(self, n_kills, n_prompts=24, kills_per_cache=25):
        t0 = time.time()
        log(f"sigkills: {n_kills} (prompt cache in {self.cache})")
        counts = dict(kills=0, runs_finished_before_kill=0, check_runs=0, store_checks=0,
                      pages_checked=0, lost_pages=0, lost_durable_pages=0, torn_pages_served=0,
                      mismatching_outputs=0, runs_reusing_pages=0, tokens_reused=0,
                      kills_while_storing=0, kills_after_new_pages_stored=0)
        # The outputs without a cache, of a pool of prompts; a new (empty) prompt cache every
        # kills_per_cache kills, so the killed runs keep having pages to store.
        durations = []
        while len(self.reference) < n_prompts:
            text = self.prompt()
            self.reference[text] = self.run(False).stdout
            durations.append(self.last_s)
        full_s = sorted(durations)[len(durations) // 2]  # a run's length, about
        pool = list(self.reference)
        durable_pages = 0
        stored = set()  # prompts a finished run has stored in this cache
        n_caches = 1
        while counts["kills"] < n_kills:
            if counts["kills"] >= n_caches * kills_per_cache:
                self.cache = os.path.join(self.workdir, f"prompt-cache-{n_caches}")
                n_caches += 1
                durable_pages = 0
                stored = set()
            # Half the kills go to a prompt this cache has not stored yet, while it stores.
            fresh = [t for t in pool if t not in stored]
            during_store = bool(fresh) and self.rng.random() < 0.5
            text = self.prompt(self.rng.choice(fresh if during_store else pool))
            before = self.store_bytes()
            child = subprocess.Popen(self.argv(True, self.prompt_path), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
            if during_store:
                # While it stores: within 2 ms of the first byte it adds to the store's files
                # (slot writes, syncs, the journal's publish record), or when it ends.
                while child.poll() is None and self.store_bytes() == before:
                    time.sleep(0.0001)
                time.sleep(0.002 * self.rng.random())
            else:
                # Anywhere in the run, most often in its second half.
                time.sleep(full_s * (self.rng.random() if self.rng.random() < 0.3
                                     else 0.4 + 0.6 * self.rng.random()))
            if child.poll() is None:
                counts["kills_while_storing"] += during_store
                child.send_signal(signal.SIGKILL)
                counts["kills"] += 1
                full_s *= 1.03 if not during_store else 1.0
            else:
                counts["runs_finished_before_kill"] += 1
                full_s *= 0.85 if not during_store else 1.0  # about one in seven ends first
            child.wait()
            # The check: a store that verifies, keeps every page stored before, and a run that
            # prints what a run without a cache prints.
            report = self.check_store()
            counts["store_checks"] += 1
            counts["pages_checked"] += report.get("pages", 0)
            counts["lost_pages"] += max(0, report.get("lost_pages", 0))
            if not report.get("ok", False):
                log(f"  store check failed: {report}")
            counts["lost_durable_pages"] += max(0, durable_pages - report.get("pages", 0))
            # The killed run had stored pages (some or all of its prompt's) before it died.
            counts["kills_after_new_pages_stored"] += (child.returncode == -signal.SIGKILL and
                                                       report.get("pages", 0) > durable_pages)
            r = self.run(True, stats=True)
            counts["check_runs"] += 1
            stored.add(text)
            m = re.search(r"prompt cache: (\d+) of \d+ prompt tokens reused", r.stderr)
            reused = int(m.group(1)) if m else 0
            counts["tokens_reused"] += reused
            counts["runs_reusing_pages"] += reused > 0
            if r.stdout != self.reference[text]:
                counts["mismatching_outputs"] += 1
                # Pages were served and the text differs: a wrong page would show here.
                counts["torn_pages_served"] += reused > 0
                log(f"  MISMATCH after kill {counts['kills']}")
            m = re.search(r"prompt cache: store of (\d+) pages", r.stderr)
            durable_pages = max(durable_pages, int(m.group(1)) if m else 0)
            if counts["kills"] % 20 == 0 and counts["kills"] > 0 and child.returncode == -9:
                log(f"  {counts['kills']} kills, {durable_pages} pages in the cache, "
                    f"{counts['mismatching_outputs']} mismatching outputs")
        counts["pages_in_cache_at_end"] = durable_pages
        counts["distinct_prompts"] = len(self.reference)
        counts["prompt_caches"] = n_caches
        counts["seconds"] = round(time.time() - t0, 1)
        return counts


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build/release"))
    p.add_argument("--model", default=os.path.join(ROOT, "../shared/models/stories260K.gguf"))
    p.add_argument("--cuts", type=int, default=1000)
    p.add_argument("--kills", type=int, default=200)
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--workdir", default=None,
                   help="where the SIGKILL campaign's prompt cache lives (default: the temp dir)")
    p.add_argument("--json", default="-")
    a = p.parse_args()
    argus = os.path.join(a.build, "argus")
    t0 = time.time()
    info = subprocess.run([argus, "info"], capture_output=True, text=True).stdout
    cuts = power_cuts(a.build, a.cuts, a.seed)
    with tempfile.TemporaryDirectory(prefix="argus-chaos-", dir=a.workdir) as work:
        kills = Kills(argus, a.model, work, random.Random(a.seed)).campaign(a.kills)
    totals = {
        "power_cuts": cuts["power_cuts"],
        "sigkills": kills["kills"],
        "pages_checked": cuts["pages_checked"] + kills["pages_checked"],
        "lost_pages": cuts["lost_pages"] + kills["lost_pages"],
        "lost_durable_pages": cuts["lost_durable_pages"] + kills["lost_durable_pages"],
        "torn_pages_served": cuts["torn_pages_served"] + kills["torn_pages_served"],
        "mismatching_outputs": cuts["mismatching_outputs"] + kills["mismatching_outputs"],
        "outputs_compared": cuts["outputs_compared"] + kills["check_runs"],
    }
    ok = (cuts["test_passed"] and totals["lost_pages"] == 0 and totals["lost_durable_pages"] == 0
          and totals["torn_pages_served"] == 0 and totals["mismatching_outputs"] == 0)
    result = {
        "command": "scripts/chaos.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": info.strip().splitlines(),
        "seed": a.seed,
        "ok": ok,
        "totals": totals,
        "power_cut_campaign": cuts,
        "sigkill_campaign": kills,
        "seconds": round(time.time() - t0, 1),
    }
    text = json.dumps(result, indent=2) + "\n"
    if a.json == "-":
        sys.stdout.write(text)
    else:
        with open(a.json, "w") as f:
            f.write(text)
    log(f"chaos: {totals}; {'ok' if ok else 'FAILED'} in {result['seconds']} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

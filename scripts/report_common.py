"""What the table scripts share: progress on stderr, running a tool, the pinned profiles, writing
the JSON report."""
import json
import os
import subprocess
import sys


def log(message):
    print(message, file=sys.stderr, flush=True)


def run(command, with_stderr=False):
    """The command's stdout (and stderr); exits naming the command when it fails."""
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n"
                         f"{result.stderr[-4000:]}")
    return result.stdout + (result.stderr if with_stderr else "")


def write_report(report, path, indent=2):
    with open(path, "w") as f:
        json.dump(report, f, indent=indent)
        f.write("\n")


def pinned_profile(base, scratch):
    """The built-in profile with pins of 4 sinks and 16 recent tokens (the built-ins pin the last
    256 tokens: a whole window of the small models' evaluations), as a JSON file in scratch."""
    path = os.path.join(scratch, f"{base}-pin16.json")
    with open(path, "w") as f:
        json.dump({"name": f"{base}-pin16", "base": base, "pins": {"sinks": 4, "recent": 16}}, f)
    return path

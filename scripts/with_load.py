"""Run a command while other processes keep the CPU cores busy, then stop them.

    python scripts/with_load.py [--procs N] -- COMMAND [ARG ...]

A learner's laptop is rarely idle: the chapters assert measurements of the machine (exponents,
speed-ups, ratios), and those assertions must hold when other work competes for every core.
`make test-notebooks-busy` runs the notebook tests this way. The loaders are plain CPU-bound loops at
normal priority (default: one per core), started before and killed after COMMAND, whose exit status
is returned.
"""
import argparse
import os
import signal
import subprocess
import sys

LOOP = "while True: pass"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 2, help="busy processes (default: cores)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("command: expected a command after --; got nothing")
    if args.procs < 1:
        ap.error(f"--procs: expected at least 1; got {args.procs}")
    loaders = [subprocess.Popen([sys.executable, "-c", LOOP]) for _ in range(args.procs)]
    print(f"with_load: {args.procs} busy process(es) running beside: {' '.join(cmd)}", flush=True)
    try:
        return subprocess.call(cmd)
    finally:
        for p in loaders:
            p.send_signal(signal.SIGKILL)
            p.wait()
        print(f"with_load: stopped the {args.procs} busy process(es)", flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""The grading kernel: an ipykernel whose address space and CPU time are capped before it starts.

Used by grade.py through a kernel spec whose argv is
    python scripts/course/limited_kernel.py --mem-mb M --cpu-s C -f {connection_file}
RLIMIT_AS caps the kernel's virtual memory: an allocation beyond it fails inside the student's
code (numpy raises MemoryError), so that cell errors and the kernel lives on. RLIMIT_CPU is the
backstop for the whole notebook: past it the kernel gets SIGXCPU and dies (nbgrader's per-cell
timeout normally interrupts a looping cell long before). Limits apply to the kernel process and
anything it starts; they are POSIX rlimits, not a sandbox (see book/running.md).
"""
import argparse
import resource
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mem-mb", type=int, required=True)
    ap.add_argument("--cpu-s", type=int, required=True)
    args, rest = ap.parse_known_args()
    mem = args.mem_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (args.cpu_s, args.cpu_s + 5))
    sys.argv = [sys.argv[0]] + rest
    from ipykernel import kernelapp
    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()

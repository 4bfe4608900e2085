#!/usr/bin/env python3
"""Runs every test case of a Catch2 (v2) program, split into shards run side by side.

    run_shards.py PROGRAM [--jobs N] [--shards K] [--spec SPEC] [-- CATCH_ARGS...]

The cases come from the program itself (--list-test-names-only, restricted to SPEC when
given), are dealt round-robin into K name files, and K processes run them (-f FILE), N at a
time. A shard that fails prints its whole output. The run fails unless every shard passed and
the cases the shards report having run add up to the list: no case can be left out.

Used by `make sanitize` and `make tsan`: a case in its own process (ctest) costs the start of
an instrumented program each time, a large share of the sanitizer stages; a few processes per
core keep both cores busy for the same coverage.
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile


def escape(name: str) -> str:
    # Catch2's test-spec syntax gives these characters meanings; a backslash takes them
    # literally (as CMake's catch_discover_tests writes them).
    return re.sub(r"([\[\],\\*~\"])", r"\\\1", name)


def cases_run(output: str) -> int | None:
    # "All tests passed (N assertions in M test cases)" or "test cases: M | ..."
    m = re.search(r"All tests passed \(\d+ assertions? in (\d+) test cases?\)", output)
    if m:
        return int(m.group(1))
    m = re.search(r"test cases:\s*(\d+)", output)
    return int(m.group(1)) if m else None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("program")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--shards", type=int, default=0, help="default: 8 per job")
    parser.add_argument("--spec", default="")
    parser.add_argument("catch_args", nargs="*")
    args = parser.parse_args()

    listing = subprocess.run([args.program, "--list-test-names-only"] + ([args.spec] if args.spec else []),
                             capture_output=True, text=True)
    # A name starting with '#' is listed in quotes.
    names = [line[1:-1] if line.startswith('"#') and line.endswith('"') else line
             for line in listing.stdout.splitlines() if line.strip()]
    if listing.returncode < 0 or not names:
        print(f"run_shards: {args.program} listed no test cases (status {listing.returncode})\n"
              f"{listing.stderr}", file=sys.stderr)
        return 1
    shards = max(1, min(len(names), args.shards or 8 * args.jobs))
    groups = [names[i::shards] for i in range(shards)]

    with tempfile.TemporaryDirectory() as tmp:
        def run(index: int):
            path = os.path.join(tmp, f"shard{index}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write("".join(escape(n) + "\n" for n in groups[index]))
            proc = subprocess.run([args.program, "-f", path, "--durations", "yes"] + args.catch_args,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  errors="replace")
            return index, proc.returncode, proc.stdout

        failed = 0
        counted = 0
        durations = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for index, status, output in pool.map(run, range(shards)):
                ran = cases_run(output)
                expected = len(groups[index])
                if status != 0 or ran != expected:
                    failed += 1
                    print(f"run_shards: shard {index + 1}/{shards} FAILED (status {status}, "
                          f"{ran} of {expected} cases reported run):\n{output}")
                else:
                    print(f"run_shards: shard {index + 1}/{shards}: {ran} cases passed")
                counted += ran or 0
                durations += [(float(m.group(1)), m.group(2)) for m in
                              re.finditer(r"^(\d+\.\d+) s: (.*)$", output, re.MULTILINE)]
    # The longest cases (and sections) bound how evenly the shards end.
    for seconds, name in sorted(durations, reverse=True)[:8]:
        print(f"run_shards: {seconds:8.2f} s  {name}")
    print(f"run_shards: {counted} of {len(names)} cases run in {shards} shards, {failed} shards failed")
    return 0 if failed == 0 and counted == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())

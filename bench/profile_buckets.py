"""Where a profile's samples go, from inferno's folded stacks (collapsed with
`--all`, so kernel frames end in `_[k]`): each sample is put in the bucket of
the frame nearest its leaf that belongs to one (so the shares add up to 100%;
a wrapper such as the connection's task does not swallow the work under it),
the inclusive share of the leaf-level buckets, and the heaviest frames.

    python3 bench/profile_buckets.py scenario.folded > scenario.buckets.md
"""

import re
import sys
from collections import Counter

# First match wins for self time; inclusive shares may overlap.
BUCKETS = [
    ("kernel (syscalls, network stack, scheduling)", r"_\[k\]$"),
    # glibc's and jemalloc's (the default build's: `_rjem_je_*`, `tikv_jemallocator`).
    ("allocation (malloc, free, realloc)", r"(^|::)(malloc|free|realloc|calloc|cfree|_int_malloc|_int_free|_int_realloc|malloc_consolidate|tcache|__libc_malloc|__libc_free|__libc_realloc|_rjem_|tikv_jemalloc)"),
    ("memcpy / memmove", r"(__memmove|__memcpy|memcpy|memmove|__memset|memset)"),
    ("JSON: serde_json, sonic-rs (parse, serialize)", r"serde_json::|serde::|sonic_rs::"),
    ("JSON: agent-proxy's scanner (check, build values)", r"agent_proxy::json::scan::"),
    ("tracing (logs)", r"tracing(_subscriber|_core)?::"),
    ("prometheus (metrics)", r"prometheus::"),
    ("hashing", r"(siphash|SipHasher|hash::|Hasher|ahash|fxhash|hashbrown)"),
    ("pingora HTTP/1 (parse, headers, bodies)", r"pingora_core::protocols::http|pingora_http::|httparse::"),
    ("pingora proxy path", r"pingora_proxy::"),
    ("pingora other", r"pingora"),
    ("tokio (scheduler, I/O driver, timers)", r"tokio::"),
    ("agent-proxy's own code", r"agent_proxy::"),
]


def main(path):
    stacks = []
    total = 0
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        stacks.append((frames, n))
        total += n
    if total == 0:
        print("no samples")
        return
    compiled = [(name, re.compile(pattern)) for name, pattern in BUCKETS]
    inclusive = Counter()
    self_time = Counter()
    leaf = Counter()
    ours = Counter()
    for frames, n in stacks:
        for name, pattern in compiled:
            if any(pattern.search(f) for f in frames):
                inclusive[name] += n
        last = frames[-1]
        leaf[last] += n
        bucket = next(
            (
                name
                for frame in reversed(frames)
                for name, pattern in compiled
                if pattern.search(frame)
            ),
            "other",
        )
        self_time[bucket] += n
        # The agent-proxy frame nearest the leaf: whose work the sample is.
        mine = next(
            (f for f in reversed(frames) if "agent_proxy::" in f and "service::edge" not in f),
            None,
        )
        if mine:
            ours[mine] += n
    pct = lambda n: f"{100 * n / total:.1f}%"
    print(f"{total} samples\n")
    print("| bucket | nearest the leaf (adds up to 100%) | inclusive |")
    print("|---|---|---|")
    for name, _ in BUCKETS:
        print(f"| {name} | {pct(self_time[name])} | {pct(inclusive[name])} |")
    print(f"| other | {pct(self_time['other'])} | |")
    print("\nHeaviest frames by self time:\n")
    print("| frame | self |")
    print("|---|---|")
    for frame, n in leaf.most_common(15):
        print(f"| `{short(frame)}` | {pct(n)} |")
    print("\nagent-proxy frames nearest the sample (its own work and what it calls; the connection wrapper `service::edge` left out):\n")
    print("| frame | share |")
    print("|---|---|")
    for frame, n in ours.most_common(15):
        print(f"| `{short(frame)}` | {pct(n)} |")


def short(frame):
    frame = re.sub(r"::h[0-9a-f]{16}$", "", frame)
    return frame if len(frame) <= 110 else frame[:107] + "..."


if __name__ == "__main__":
    main(sys.argv[1])

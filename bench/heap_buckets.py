"""Per-stream heap at the peak, by allocating call site, from heaptrack's
folded peak stacks (`heaptrack_print --flamegraph-cost-type peak -F`).

    python3 bench/heap_buckets.py FOLDED STREAMS [ROWS]

Each stack is named by its three innermost frames that are not allocator or
generic plumbing (Box::pin, Vec growth, poll), so a row is one call site.
"""

import collections
import re
import sys

PLUMBING = re.compile(
    r"^(alloc|alloc_impl|alloc_impl_runtime|allocate|allocate_zeroed|try_allocate_in<>|"
    r"with_capacity_in<>|with_capacity<>|with_capacity|finish_grow<>|grow_amortized<>|"
    r"do_reserve_and_handle<>|reserve<>|reserve_inner|reserve|box_new_uninit|new<>|pin<>|"
    r"grow_impl|grow_impl_runtime|grow|realloc|_RNv.*|try_insert2<>|insert_header_value<>|"
    r"insert<>|try_insert<>|to_vec_in<>|to_vec<>|clone<>|push<>|poll<>|with_mut<>|"
    r"\{closure#0\}<>|malloc|calloc)( \(.*\))?$"
)

folded, streams = sys.argv[1], int(sys.argv[2])
rows = int(sys.argv[3]) if len(sys.argv) > 3 else 12
sites = collections.Counter()
total = 0
for line in open(folded):
    stack, _, size = line.rstrip().rpartition(" ")
    total += int(size)
    frames = [f for f in stack.split(";") if f and not PLUMBING.match(f)]
    sites[" ← ".join(reversed(frames[-3:]))] += int(size)
print(f"heap at the peak: {total / streams / 1024:.1f} KiB per stream\n")
print("| KiB per stream | allocated at |")
print("|---|---|")
for site, size in sites.most_common(rows):
    print(f"| {size / streams / 1024:.2f} | `{site}` |")

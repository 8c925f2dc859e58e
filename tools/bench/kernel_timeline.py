#!/usr/bin/env python3
"""Where a replayed CUDA graph's time goes, from a kernel_trace CSV.

  python3 tools/bench/kernel_timeline.py trace.csv [--graph-node-count N]

Takes the last complete replay of the graph with the most kernel records
(one decode step of `engine_cuda_bench`), and prints one JSON line per
kernel (by demangled name without arguments, and grid size) with its
launches per replay,
the mean time each ran, and its exposed time: the time from the later of its
start and the previous kernel's end to its own end, summed. Kernels that
start early under programmatic dependent launch and wait are charged only
for the time they add to the chain, so the exposed times add up to the
replay's span (a kernel fully hidden under its neighbours gets 0). Kernels
on other streams than the step's (side-stream prefetches) are listed without
an exposed time. A last line gives the replay's span and kernel count and,
over back-to-back replays, the median period between their starts and what
of it lies outside the replay (`outside_replay_us`).
"""
import argparse
import collections
import csv
import json
import re
import statistics


def kernel_name(name):
    """The demangled name without namespaces and arguments, templates kept."""
    name = name.replace("(anonymous namespace)::", "")
    depth = 0
    for i, ch in enumerate(name):  # cut at the argument list
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    head, sep, tmpl = name.partition("<")
    return head.split("::")[-1].split(" ")[-1] + sep + tmpl.replace(" ", "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--graph-node-count", type=int, default=0,
                    help="kernels per replay (default: distinct graph nodes)")
    args = ap.parse_args()
    with open(args.trace) as f:
        rows = [r for r in csv.DictReader(f) if r["graph_id"] != "0"]
    if not rows:
        raise SystemExit("no kernels launched from a CUDA graph in " + args.trace)
    by_graph = collections.Counter(r["graph_id"] for r in rows)
    graph = by_graph.most_common(1)[0][0]
    rows = [r for r in rows if r["graph_id"] == graph]
    for r in rows:
        r["s"], r["e"] = int(r["start_ns"]), int(r["end_ns"])
    rows.sort(key=lambda r: r["s"])
    n = args.graph_node_count or len({r["graph_node_id"] for r in rows})
    replay = rows[-n:]
    t0 = replay[0]["s"]
    span = max(r["e"] for r in replay) - t0
    main_stream = collections.Counter(r["stream"] for r in replay).most_common(1)[0][0]
    stats = collections.OrderedDict()
    chain_end = t0
    for r in replay:
        key = (kernel_name(r["name"]), int(r["grid"]), r["stream"] == main_stream)
        s = stats.setdefault(key, [0, 0, 0])
        s[0] += 1
        s[1] += r["e"] - r["s"]
        if key[2]:
            s[2] += max(0, r["e"] - max(r["s"], chain_end))
            chain_end = max(chain_end, r["e"])
    for (name, grid, on_main), (count, busy, exposed) in sorted(stats.items(),
                                                                key=lambda kv: -kv[1][2]):
        line = {"kernel": name, "grid": grid, "per_replay": count,
                "mean_us": round(busy / count / 1e3, 2)}
        if on_main:
            line.update(exposed_us=round(exposed / 1e3, 1),
                        exposed_share=round(exposed / span, 3))
        else:
            line.update(stream="side")
        print(json.dumps(line))
    summary = {"replay_us": round(span / 1e3, 1), "kernels": n, "graph_id": int(graph)}
    # Back-to-back replays (a decode loop): the time from one replay's first
    # kernel to the next one's, against the span, is what the step spends
    # outside the graph (host work, copies, the launch).
    starts = [rows[i]["s"] for i in range(0, len(rows) - n + 1, n)]
    if len(starts) >= 3:
        period = statistics.median(b - a for a, b in zip(starts, starts[1:]))
        summary.update(replay_period_us=round(period / 1e3, 1),
                       outside_replay_us=round((period - span) / 1e3, 1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

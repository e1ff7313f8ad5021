"""The GPU examples' timers (bench_backend.py, bench_overhead.py, bench_norm.py, bench_tree.py,
compare_collectives.py): one way to time eager host cost and CUDA-graph replays, so that their
tables compare."""

import statistics
import time

import torch


def host_us(fn, *, calls=200, rounds=5, before_round=None):
    """Host microseconds per eager call: the wall time of `calls` back-to-back calls / calls (the GPU
    running behind), median of `rounds` rounds after 20 warm-up calls. before_round (e.g. a barrier
    that lines the ranks up) runs off the clock before each round."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        if before_round is not None:
            before_round()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def graph_us(fn, *, graph_ops=20, replays=25, rounds=3, warmups=1, before_replay=None, after_capture=None):
    """GPU microseconds per call: `graph_ops` calls captured in one CUDA graph (after `warmups` eager
    calls on a side stream, which also make any communicator), each replay timed by events on a
    stream of its own, the median of `replays` replays per round and the median of `rounds` rounds.
    before_replay (e.g. a barrier) runs before each timed replay. after_capture (e.g. a
    communicator's collective that registers the captured buffers) runs once after the capture,
    before the first replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(graph_ops):
            fn()
    torch.cuda.synchronize()
    if after_capture is not None:
        after_capture()
    medians = []
    replay_stream = torch.cuda.Stream()
    with torch.cuda.stream(replay_stream):
        graph.replay()
        for _ in range(rounds):
            times = []
            for _ in range(replays):
                if before_replay is not None:
                    before_replay()
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(begin.elapsed_time(end) * 1000.0 / graph_ops)
            medians.append(statistics.median(times))
    del graph
    return statistics.median(medians)

"""A model of data-parallel scaling: the step time of each strategy at N GPUs from what one run
measured (its compute-only step, its gradient size and buckets) and a network (a preset from
published link rates, or the user's own ``bench probe``).

All-reduce follows NCCL's own cost model (NCCL 2.30, src/graph/tuning.cc): a collective costs
a base latency plus a latency per step (2(N-1) steps for a ring all-reduce, 2(M-1) of them
across the M nodes at the network's latency, the rest at least the network's overhead, x1.4
for a multi-node Simple ring; 2(log2 M) network hops and 2(N/M - 1) hops inside a node for a
tree) plus bytes over the algorithm bandwidth (a ring's busbw * N / 2(N-1); a tree's busbw *
.92 * .5, times NCCL's correction for medium sizes; LL halves a ring's bandwidth and divides
a tree's by 3.8), and NCCL takes the fastest of ring and tree, LL and Simple. DDP's buckets are
simulated as backward makes them ready, backward and an all-reduce under it slowed by what
the probe measured them to cost each other (none for a datasheet network); SyncBatchNorm
adds two blocking small collectives per BatchNorm layer; FSDP moves 1.5x DDP's bytes (its
all-gathers and reduce-scatter at the cost against all-reduce that a probe measured, where
one did) in a pipeline of its run's units (ResNet-18's five) a phase, compute or
communication the busier; Horovod fuses into 64 MiB buffers each cycle.

Left out, and said with every projection: the input pipeline, stragglers, network congestion
and contention between jobs, and any change of compute with N (the per-GPU batch is held at the
measured run's, as large-scale training does)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.records.gradient_timeline import GradientTimeline

LEFT_OUT = ("input pipeline, stragglers, congestion and other jobs on the network; per-GPU "
            "batch held at the measured run's (global batch grows with N)")

# NCCL's tuning model, from NVIDIA/nccl 2.30 (master 5067397, June 2026; src/graph/tuning.cc,
# ncclTopoTuneModel and ncclTopoGetAlgoTime): latencies in microseconds by (algorithm,
# protocol). LL128 is left out (NVLink only, and chosen per GPU architecture).
BASE_US = {("ring", "ll"): 6.6, ("ring", "simple"): 8.4,  # baseLatencies
           ("tree", "ll"): 6.8, ("tree", "simple"): 8.4}
HOP_US = {  # hwLatencies: one step over NVLink, PCIe, or the network
    "nvlink": {("tree", "ll"): 0.6, ("tree", "simple"): 4.0,
               ("ring", "ll"): 0.6, ("ring", "simple"): 3.4},
    "pci": {("tree", "ll"): 1.0, ("tree", "simple"): 4.0,
            ("ring", "ll"): 1.0, ("ring", "simple"): 5.7},
    "net": {("tree", "ll"): 5.0, ("tree", "simple"): 14.0,
            ("ring", "ll"): 2.7, ("ring", "simple"): 14.0},
}
# A multi-node ring's steps inside a node cost at least the network's overhead (1 us on an
# Intel host, 2 on AMD; x3 for Simple), and its Simple latency grows x1.4 once each channel's
# share of the message is 64 bytes or more ("plateau effect of ring"; x1.9 before Ampere).
NET_OVERHEAD_US = 1.0
RING_PLATEAU = 1.4
ASSUMED_CHANNELS = 16  # NCCL's channels per communicator: only the plateau's onset uses it
TREE_BANDWIDTH = 0.92  # a tree all-reduce reaches .92 of the bus bandwidth
LL_BANDWIDTH = {"ring": 0.5, "tree": 1 / 3.8}  # LL's flags halve a ring's bytes, cost a tree more
# Trees do not follow the model at medium sizes: NCCL scales their bandwidth by a factor per
# power of two of the size, 64 B to 256 MiB (treeCorrectionFactor; LL and Simple rows).
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9, .9),
}

FORWARD_SHARE = 1 / 3  # of the compute step: forward ~ 1/3, backward ~ 2/3 of the FLOPs
HOROVOD_FUSION_BYTES = 64 * 1024 * 1024  # HOROVOD_FUSION_THRESHOLD default
HOROVOD_CYCLE_S = 0.001  # HOROVOD_CYCLE_TIME default (1 ms)
RESNET18_BN_LAYERS = 20  # 1 stem + 2 per basic block x 8 + 3 downsample
SYNCBN_MESSAGE_BYTES = 2 * 512 * 4  # mean and variance of the widest layer, fp32


@dataclass(frozen=True)
class Network:
    """Per-GPU all-reduce bus bandwidth inside a node and per node across nodes (GB/s, as
    nccl-tests reports busbw), and the hop kind inside a node."""

    name: str
    intra_busbw_gbps: float
    inter_node_gbps: float
    intra_hop: str  # "nvlink" | "pci"
    source: str
    fixed_latency_s: float | None = None  # a measured network (probe): per ring step
    # An all-gather's and a reduce-scatter's time over half an all-reduce's of the same
    # tensor: 1 for NCCL's rings (each moves half an all-reduce's bytes); a probe measures
    # its backend's (gloo's took 3.8 and 5.2 on loopback, 2 ranks, 89.6 MB)
    gather_factor: float = 1.0
    scatter_factor: float = 1.0
    # What communication and compute cost each other while they overlap, as the probe
    # measured them on its machines (``bench probe``'s contention): compute takes
    # 1 + compute_slowdown times as long with an all-reduce running, and an all-reduce
    # 1 + comm_slowdown times as long beside the compute. 0 where not measured (datasheet
    # networks, probes before 2026-12-03): overlapped communication is then free.
    compute_slowdown: float = 0.0
    comm_slowdown: float = 0.0

    def busbw(self, nodes: int) -> float:
        """Bytes/s a ring achieves: the intra-node links, and across nodes the slower of
        those and each node's network."""
        gbps = self.intra_busbw_gbps if nodes == 1 else min(self.intra_busbw_gbps,
                                                            self.inter_node_gbps)
        return gbps * 1e9


# Link rates from the vendors' figures, times 0.8 for what nccl-tests typically achieves of a
# link's rate (an assumption, stated; use --intra-busbw/--inter-busbw or a probe for yours).
_ACHIEVED = 0.8
NETWORKS = {
    "h100-nvlink-ndr": Network(
        "h100-nvlink-ndr", 450 * _ACHIEVED, 8 * 50 * _ACHIEVED, "nvlink",
        "NVLink 4 on H100 SXM: 900 GB/s bidirectional per GPU (H100 datasheet); DGX H100: "
        "8 x ConnectX-7 InfiniBand NDR 400 Gb/s per node (DGX H100 user guide)"),
    "a100-nvlink-hdr": Network(
        "a100-nvlink-hdr", 300 * _ACHIEVED, 8 * 25 * _ACHIEVED, "nvlink",
        "NVLink 3 on A100 SXM: 600 GB/s bidirectional per GPU (A100 datasheet); DGX A100: "
        "8 x InfiniBand HDR 200 Gb/s per node (DGX A100 user guide)"),
    "pcie-ethernet-100g": Network(
        "pcie-ethernet-100g", 32 * _ACHIEVED, 12.5 * _ACHIEVED, "pci",
        "PCIe 4.0 x16: 32 GB/s per direction (PCI-SIG); one 100 Gb/s Ethernet port per node"),
}


# What a projection over one of NETWORKS (datasheet rates, not a probe) rests on: the model
# against 19 published results (benchmarks/published_scaling.py, docs/projection.md). A test
# recomputes these figures from the benchmark, so this sentence cannot drift from them.
PUBLISHED_MEDIANS = {"model": 25.3, "no communication": 25.4, "no overlap": 22.3}
DATASHEET_CAVEAT = (
    "from datasheet rates (not a probe): against 19 published results the model did no "
    "better than 'no communication' (median |error| where communication costs >= 15 %: "
    f"model {PUBLISHED_MEDIANS['model']} %, no communication "
    f"{PUBLISHED_MEDIANS['no communication']} %, no overlap {PUBLISHED_MEDIANS['no overlap']} "
    "%): its communication figures are a guess until `bench probe` measures your network "
    "(docs/projection.md)")


def _log2i(n: int) -> int:
    """NCCL's log2i (log2Down): the floor of log2, -1 for 0."""
    return int(n).bit_length() - 1


def _nccl_allreduce_s(size: int, ranks: int, nodes: int, net: Network, algorithm: str,
                      protocol: str) -> float:
    """One (algorithm, protocol)'s time for an all-reduce, as ncclTopoGetAlgoTime has it:
    latency plus bytes over the algorithm bandwidth."""
    key = (algorithm, protocol)
    per_node, busbw = ranks // nodes, net.busbw(nodes)
    intra = HOP_US[net.intra_hop][key]
    if algorithm == "ring":
        steps, inter_steps = 2 * (ranks - 1), 2 * (nodes - 1)
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if protocol == "simple" else 1))
        # with one rank a node every step's latency is exposed: the tree's network latency
        inter = HOP_US["net"][("tree" if per_node == 1 else "ring", protocol)]
        latency = BASE_US[key] + (steps - inter_steps) * intra + inter_steps * inter
        if (protocol == "simple" and nodes > 1
                and size / (ASSUMED_CHANNELS * ranks) >= 64):
            latency *= RING_PLATEAU
        bandwidth = busbw * (LL_BANDWIDTH["ring"] if protocol == "ll" else 1.0)
        algbw = bandwidth * ranks / steps
    else:
        latency = BASE_US[key] + 2 * ((per_node - 1) * intra
                                      + _log2i(nodes) * HOP_US["net"][key])
        bandwidth = busbw * TREE_BANDWIDTH * (LL_BANDWIDTH["tree"] if protocol == "ll" else 1.0)
        algbw = bandwidth * 0.5
        log_size = _log2i(int(size) >> 6)
        if 0 <= log_size < 23:
            algbw *= TREE_CORRECTION[protocol][log_size]
    return latency * 1e-6 + size / algbw


def allreduce_s(size: int, ranks: int, nodes: int, net: Network) -> float:
    """Seconds for one all-reduce of ``size`` bytes over ``ranks`` GPUs on ``nodes`` nodes:
    NCCL's fastest of ring and tree, LL and Simple, by its own cost model."""
    if ranks <= 1 or size <= 0:
        return 0.0
    steps = 2 * (ranks - 1)
    if net.fixed_latency_s is not None:  # measured: latency per step, busbw fitted
        return steps * net.fixed_latency_s + size * steps / ranks / net.busbw(nodes)
    return min(_nccl_allreduce_s(size, ranks, nodes, net, algorithm, protocol)
               for algorithm in ("ring", "tree") for protocol in ("ll", "simple"))


def even_buckets(total: int, cap: int) -> list[int]:
    """Bucket sizes without a measured timeline: ``cap`` bytes each, the rest last."""
    sizes, rest = [], total
    while rest > 0:
        sizes.append(min(cap, rest))
        rest -= sizes[-1]
    return sizes


FSDP_UNITS = 5  # bench's fully_shard units: each of ResNet-18's four stages and the root


@dataclass(frozen=True)
class Workload:
    """What the projection takes from one measured run (per rank, per optimizer step)."""

    strategy: str
    compute_step_s: float  # the step with gradient sync off
    gradient_bytes: int  # bytes all-reduced per step (precision and compression included)
    bucket_bytes: int  # DDP's bucket cap
    grad_accum: int = 1
    syncbn: bool = False
    batchnorm_layers: int = RESNET18_BN_LAYERS  # SyncBatchNorm: two collectives each
    hook_delay_s: float = 0.0  # BENCH_SLOW_COMM_MS: a blocking wait before each bucket
    # a comm hook's own work per step (PowerSGD's products and orthogonalisation, the casts),
    # spread over the buckets in proportion to their bytes: it holds up backward
    hook_work_s: float = 0.0
    # each bucket's collectives hold up backward until they finish (PowerSGD over gloo: bench
    # waits for each bucket in turn, docs/running.md); else they overlap it
    blocking_comm: bool = False
    timeline: GradientTimeline | None = None  # measured; None: ready evenly over backward
    # FSDP: each unit's parameters gathered again for backward (False: kept from forward,
    # --no-reshard-after-forward, so backward only reduce-scatters)
    reshard_after_forward: bool = True
    fsdp_units: int = FSDP_UNITS  # FSDP's units, the root among them, as the run recorded
    # fp32 parameters (ddp-zero broadcasts them after each step, whatever compresses the
    # gradient); None: as many bytes as the gradient
    parameter_bytes: int | None = None
    # A DDP comm hook compresses each bucket of the fp32 gradient: DDP forms its buckets
    # from these bytes (None: from gradient_bytes), each sending its share of gradient_bytes
    bucketed_bytes: int | None = None
    # all-reduces per bucket, one after the other (PowerSGD: uncompressed vectors, the
    # factors P, then Q), each with a share of the bucket's bytes
    collectives_per_bucket: int = 1

    @property
    def sent_fraction(self) -> float:
        """Bytes sent per byte bucketed (1 without a compressing hook)."""
        return self.gradient_bytes / (self.bucketed_bytes or self.gradient_bytes)

    def forward_s(self) -> float:
        """Seconds from the step's start to the last micro-step's backward."""
        if self.timeline is not None:
            return self.timeline.backward_start * self.compute_step_s
        return self.compute_step_s - self.backward_s()

    def backward_s(self) -> float:
        """Seconds of the last micro-step's backward."""
        if self.timeline is not None:
            return (self.timeline.backward_end - self.timeline.backward_start
                    ) * self.compute_step_s
        return (1 - FORWARD_SHARE) * self.compute_step_s / self.grad_accum

    def buckets(self, cap: int) -> list[tuple[float, float]]:
        """(bytes sent, seconds into the step when ready) of each bucket, DDP closing one at
        ``cap`` bytes of the gradient it buckets: from the measured timeline, else evenly
        over backward."""
        c, sent = self.compute_step_s, self.sent_fraction
        total = self.bucketed_bytes or self.gradient_bytes
        if self.timeline is not None:
            per_element = total / self.timeline.elements
            return [(size * sent, when * c)
                    for size, when in self.timeline.buckets(cap, per_element)]
        start, backward = self.forward_s(), self.backward_s()
        done, out = 0, []
        for size in even_buckets(total, cap):
            done += size
            out.append((size * sent, start + backward * done / total))
        return out


@dataclass(frozen=True)
class Projection:
    strategy: str
    gpus: int
    nodes: int
    step_s: float
    compute_step_s: float
    exposed_s: float
    bottleneck: str

    @property
    def efficiency(self) -> float:
        return self.compute_step_s / self.step_s

    @property
    def exposed_fraction(self) -> float:
        return self.exposed_s / self.step_s


def overlapped_step(w: Workload, buckets: list[tuple[float, float]], comm,
                    per_bucket_extra: float = 0.0, compute_slowdown: float = 0.0,
                    comm_slowdown: float = 0.0) -> tuple[float, float]:
    """(step seconds, seconds of it spent on communication that compute did not hide): each
    bucket's all-reduce starts when it is ready and the one before has finished; the
    optimizer runs after backward and the last all-reduce. While an all-reduce runs under
    backward, backward goes ``1 + compute_slowdown`` times slower and the all-reduce
    ``1 + comm_slowdown`` times (what the probe measured them to cost each other: on a CPU
    node gloo's copies take the cores backward needs); at 0 overlapped communication is
    free, and the step is max(backward's end, the last all-reduce's) plus the optimizer."""
    c = w.compute_step_s
    backward_end = w.forward_s() + w.backward_s()
    k = w.collectives_per_bucket
    total = sum(size for size, _ in buckets) or 1.0
    # backward as segments in order: compute up to each bucket's ready point, the hook's
    # own work (compute) and injected wait (none), then the bucket's collectives queued;
    # a blocking hook waits for them before backward goes on
    segments: list[tuple[str, float]] = []
    done = 0.0
    for size, ready in buckets:
        segments += [("compute", max(0.0, ready - done)),
                     ("compute", w.hook_work_s * size / total), ("wait", w.hook_delay_s),
                     ("send", k * comm(size / k) + per_bucket_extra)]
        done = max(done, ready)
        if w.blocking_comm:
            segments.append(("drain", 0.0))
    segments += [("compute", max(0.0, backward_end - done)), ("drain", 0.0)]
    now, queue = 0.0, []  # queue: each collective's seconds left at full speed, in order
    for kind, amount in segments:
        if kind == "send":
            queue.append(amount)
            continue
        left = math.inf if kind == "drain" else amount
        while left > 0 and (kind != "drain" or queue):
            computing = kind == "compute"
            own_rate = 1 / (1 + compute_slowdown) if computing and queue else 1.0
            comm_rate = 1 / (1 + comm_slowdown) if computing else 1.0
            until_own = left / own_rate
            until_comm = queue[0] / comm_rate if queue else math.inf
            dt = min(until_own, until_comm)
            now += dt
            left -= dt * own_rate
            if queue:
                queue[0] -= dt * comm_rate
                if dt == until_comm or queue[0] <= 1e-15:
                    queue.pop(0)
    step = now + (c - backward_end)
    return step, step - c


def _together(compute: float, comm: float, compute_slowdown: float,
              comm_slowdown: float) -> float:
    """Seconds for ``compute`` and ``comm`` (each alone) started together, each slowed by
    what the other costs it while both run: the one that ends first ends at its own time
    slowed, the other finishes alone. max(compute, comm) where they cost each other
    nothing."""
    compute_beside, comm_beside = compute * (1 + compute_slowdown), comm * (1 + comm_slowdown)
    if comm_beside <= compute_beside:  # communication ends first; compute's rest alone
        return compute + comm_beside * compute_slowdown / (1 + compute_slowdown)
    return comm + compute_beside * comm_slowdown / (1 + comm_slowdown)


def _pipelined(compute: float, comm: float, first: float, *, units: int,
               last: float = 0.0, compute_slowdown: float = 0.0,
               comm_slowdown: float = 0.0) -> float:
    """Seconds of one FSDP phase (forward, or backward) over ``units`` equal units, each
    unit's compute waiting for its all-gather, the next all-gather prefetched under it, and
    in backward its reduce-scatter after it: a flow shop whose makespan is the busier of
    the two resources plus what of the other cannot overlap it. Compute-bound: all compute,
    then the first unit's all-gather and the last one's reduce-scatter (``first`` and
    ``last`` over ``units``). Communication-bound: every collective, then the last unit's
    compute. Where the two overlap they slow each other as the probe measured
    (``_together``); with no contention this is max(compute + (first + last) / units,
    comm + compute / units)."""
    ends = (first + last) / units
    return max(ends + _together(compute, max(0.0, comm - ends), compute_slowdown,
                                comm_slowdown),
               compute / units + _together(compute - compute / units, comm,
                                           compute_slowdown, comm_slowdown))


def project(w: Workload, gpus: int, gpus_per_node: int, net: Network,
            measured_allreduce=None, measured_split=None) -> Projection:
    """One strategy at ``gpus`` GPUs; ``measured_allreduce(bytes) -> s`` replaces the model's
    all-reduce and ``measured_split`` (``(all_gather(bytes) -> s, reduce_scatter(bytes) ->
    s)``) its all-gather and reduce-scatter: validation against a probe of the same machines."""
    nodes = max(1, math.ceil(gpus / gpus_per_node))
    c = w.compute_step_s
    if gpus == 1:
        return Projection(w.strategy, 1, 1, c, c, 0.0, "compute")
    if w.strategy == "dp":
        if gpus > gpus_per_node:
            return Projection("dp", gpus, nodes, math.inf, c, math.inf,
                              "1 process, 1 node max")
        return Projection("dp", gpus, nodes, math.nan, c, math.nan,
                          "1 process: measure it")

    def comm(size: int) -> float:
        if measured_allreduce is not None:
            return measured_allreduce(size)
        return allreduce_s(size, gpus, nodes, net)

    def gather(size: int) -> float:
        if measured_split is not None:
            return measured_split[0](size)
        return comm(size) / 2 * net.gather_factor

    def scatter(size: int) -> float:
        if measured_split is not None:
            return measured_split[1](size)
        return comm(size) / 2 * net.scatter_factor

    contention = {"compute_slowdown": net.compute_slowdown, "comm_slowdown": net.comm_slowdown}
    syncbn = (2 * w.batchnorm_layers * comm(SYNCBN_MESSAGE_BYTES)
              if w.syncbn and gpus > 1 else 0.0)
    if w.strategy == "fsdp":
        forward_ag, backward_rs = gather(w.gradient_bytes), scatter(w.gradient_bytes)
        forward, backward = w.forward_s(), w.backward_s()
        backward_ag = forward_ag if w.reshard_after_forward else 0.0
        units = w.fsdp_units
        step = (c - forward - backward
                + _pipelined(forward, forward_ag, first=forward_ag, units=units, **contention)
                + _pipelined(backward, backward_ag + backward_rs,
                             first=backward_ag, last=backward_rs, units=units, **contention))
        exposed = step - c
    elif w.strategy == "horovod":
        step, exposed = overlapped_step(w, w.buckets(HOROVOD_FUSION_BYTES), comm,
                                        per_bucket_extra=HOROVOD_CYCLE_S / 2, **contention)
    else:  # DDP and its variants
        step, exposed = overlapped_step(w, w.buckets(w.bucket_bytes), comm, **contention)
        if w.strategy == "ddp-zero":  # each rank broadcasts its updated shard after the
            # step: an all-gather of the parameters, half an all-reduce's traffic, unhidden
            gather = comm(w.parameter_bytes or w.gradient_bytes) / 2
            step += gather
            exposed += gather
    step += syncbn
    exposed += syncbn
    return Projection(w.strategy, gpus, nodes, step, c, exposed,
                      _bottleneck(w, step, exposed, syncbn, gpus, nodes, net))


def _bottleneck(w: Workload, step: float, exposed: float, syncbn: float, gpus: int,
                nodes: int, net: Network) -> str:
    if exposed < 0.05 * step:
        return "compute"
    if syncbn > 0.5 * exposed:
        return "SyncBN collectives"
    if w.hook_delay_s * len(w.buckets(w.bucket_bytes)) > 0.5 * exposed:
        return "injected delay"
    bandwidth = w.gradient_bytes * 2 * (gpus - 1) / gpus / net.busbw(nodes)
    latency = allreduce_s(w.gradient_bytes, gpus, nodes, net) - bandwidth
    return "all-reduce bandwidth" if bandwidth >= latency else "collective latency"


def network_from_probe(probe: dict) -> Network:
    """The user's own network from a ``bench probe`` record: busbw of the largest message
    and the latency per ring step from the small ones (a fit of NCCL's form to the curve), and
    where the probe timed them, the all-gather's and reduce-scatter's cost against half an
    all-reduce at the gradient's size (the backend's, kept at any N).

    The latency is the least time left once the bytes are paid, over the messages whose
    bytes take under half their time: a host's other work only adds time, and one size
    slowed so (1 KiB at 3.3 ms where 4 and 16 KiB took 0.3 ms, on 2 busy cores) made it
    ten times the rest's, and the projection's bottleneck at 4,096 GPUs 'collective
    latency'. Each size's median call, not its mean (``time_mean_s``, kept beside it): on
    the testbed the means predicted small messages at 3 and 4 nodes better (24 % off
    against 62 %) and 1 MiB and more worse (8.5 % against 1.6 %), the calls DDP's buckets
    make (docs/projection.md)."""
    from bench.records.probes import contention, ideal_allreduce_s, measured_split

    points = sorted((r["bytes"], r["time_s"]) for r in probe["results"])
    ranks = probe["world_size"]
    steps = 2 * (ranks - 1)
    (small, t_small), (large, t_large) = points[0], points[-1]
    per_byte = (t_large - t_small) / (large - small)
    busbw = steps / ranks / per_byte / 1e9
    latency_bound = [t - size * per_byte for size, t in points if size * per_byte < t / 2]
    latency = max(0.0, min(latency_bound, default=t_small - small * per_byte)) / steps
    tag = f", {probe['tag']}" if probe.get("tag") else ""  # the network it measured
    label = f"probe {probe.get('probe_id')} ({probe['device']} {probe['backend']} N={ranks}{tag})"
    factors = {}
    if measured_split(probe):
        size = probe.get("gradient_bytes") or large
        half = ideal_allreduce_s(probe, size) / 2
        factors = {"gather_factor": ideal_allreduce_s(probe, size, "all_gather_s") / half,
                   "scatter_factor": ideal_allreduce_s(probe, size, "reduce_scatter_s") / half}
    also = (f"; all-gather {factors['gather_factor']:.2f} and reduce-scatter "
            f"{factors['scatter_factor']:.2f} x half an all-reduce" if factors else "")
    slowdowns = contention(probe)
    if slowdowns:
        factors.update(compute_slowdown=slowdowns[0], comm_slowdown=slowdowns[1])
        also += (f"; beside an all-reduce compute {100 * slowdowns[0]:.0f} % slower, the "
                 f"all-reduce {100 * slowdowns[1]:.0f} %")
    return Network(label, busbw, busbw, "pci",
                   f"measured by bench probe: {busbw:.2f} GB/s bus bandwidth, "
                   f"{1e6 * latency:.0f} µs per ring step{also}", fixed_latency_s=latency,
                   **factors)

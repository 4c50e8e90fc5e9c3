"""Which tests `make test` leaves to `make test-long` (CI runs the gate and a share of the
long tier in one pass: TIER=K/N, SHARES below).

`make test` is the gate a change must pass before it is committed: every test that starts no
run, and each behaviour once on its main path (ddp under torchrun, one fault of each kind,
one run of each command and strategy). Its budget is 12 minutes on 2 cores. Nearly all of a test's
cost here is starting processes: a 2-rank run imports torch three times, and DDP's
constructor imports torch._dynamo in each rank (about 12 CPU-s, of which the training is
about 3), so the suite's time is the number of runs it starts.

`make test-long` holds what repeats a path `make test` already took, or needs minutes:

- the same behaviour under the other strategies and launchers (horovod, fsdp, ddp-launch,
  ddp-spawn), and the second variant of a parametrized fault;
- statistical power: the parity self-test (18 runs), verify's self-test over every broken
  variant and every strategy, bench fit's search for the out-of-memory boundary;
- whole workflows through daemons or many runs: Slurm job arrays and a cancelled task,
  sweeps killed and resumed or shared by two, the projection validated over a shaped link;
- measurements whose figure a neighbour's load moves (they were serial, and still are).

Each entry is a regular expression searched in a test's node id; a test in
tests/test_tiers.py fails on an entry that matches no test, so the list cannot rot.
"""

from __future__ import annotations

import functools
import re
import zlib

LONG = {
    # another strategy or launcher on a path ddp under torchrun already took
    r"\[horovod\]": "the same behaviour under horovod",
    r"\[fsdp\]": "the same behaviour under fsdp",
    r"\[ddp-launch": "the same behaviour under torch.distributed.launch",
    r"\[ddp-spawn": "the same behaviour under mp.spawn",
    r"hangs_in_rank_1\]": "a factory hanging in one rank (every rank hanging stays)",
    r"hangs_in_every_rank\]": "a factory hanging in every rank: the timeout path of "
                               "test_hanging_rank_is_ended_by_the_timeout",
    r"closed[12]\]": "stdin closed is the case kept; stdout and stderr closed repeat it",
    r"test_out_of_memory_is_one_line_naming_the_batch_and_the_fix\[2": "the 2-rank variant",
    r"test_watchdog_ends_a_rank_that_stops_without_a_collective\[dp\]": "the dp variant",
    r"test_a_stopped_rank_does_not_keep_torchrun_from_restarting": "a restart's second "
    "path (a stopped rank; the first: a rank that raised)",
    r"test_eval_counts_each_test_image_once\[[23]\]": "3 and 2 ranks (1 rank stays)",
    r"test_knobs_change_what_ddp_is_built_with\[defaults\]": "defaults (the set knobs stay)",
    r"test_a_probe_across_nodes_measures_the_rate_of_their_links\[2-200\]":
        "the second rate (50 Mbit/s stays)",
    # statistical power
    r"test_parity.py::test_the_self_test_sees": "18 runs: the parity self-test's power",
    r"test_verify.py::test_self_test_catches_every_broken_variant": "verify's power",
    r"test_verify.py::test_verify_passes_every_cpu_strategy": "verify of every strategy",
    r"test_model_rows.py::test_verify_checks_powersgd": "verify of the hooks",
    r"test_model_rows.py::test_the_self_test_keeps_its_power": "verify's power under a hook",
    r"test_cpu_syncbn.py::test_bench_verify_holds_bf16": "verify's power under bf16 and "
                                                         "bench's CPU SyncBatchNorm",
    r"test_model_rows.py::test_verify_passes_fsdp_without_resharding": "verify of an fsdp "
                                                                       "option",
    r"test_model_rows.py::test_fsdp_without_resharding_is_recorded": "an fsdp option",
    r"test_fit.py::test_the_batch_found": "bench fit's search: a run per batch tried",
    r"test_fit.py::test_a_sweep_at_the_largest": "bench sweep --batch-size max: two fit "
                                                 "searches under a real limit, then the runs",
    # workflows through daemons or many runs
    r"test_slurm.py::test_a_cancelled_array_task": "a Slurm array, cancelled and resubmitted",
    r"test_slurm.py::test_a_sweep_runs_as_job_arrays": "a sweep as Slurm arrays",
    r"test_slurm.py::test_a_sweep_over_two_nodes": "a sweep as arrays on a two-node Slurm",
    r"test_slurm.py::test_an_array_task_killed_with_sigkill": "a Slurm array task killed "
                                                              "with SIGKILL, resubmitted",
    r"test_slurm.py::test_a_step_whose_tasks_do_not_match": "a refused Slurm step",
    r"test_slurm.py::test_a_batch_step_and_a_one_task_step": "two more Slurm step shapes",
    r"test_slurm.py::test_exclusive_array_tasks": "two Slurm arrays, packed and whole",
    r"test_kill.py::test_kill_9_of_bench_sweep": "a sweep killed and resumed",
    r"test_sweep.py::test_two_sweeps_at_once": "two sweeps sharing combinations",
    r"test_sweep.py::test_a_lost_hosts_claim": "a host lost mid-run, its claim taken later",
    r"test_testbed.py::test_the_projection_predicts": "validation over a shaped link",
    r"test_testbed.py::test_fsdps_compute_only_step": "FSDP over a shaped link",
    r"test_testbed.py::test_a_probe_across_nodes_measures_the_rate_of_their_links\[4-50":
        "the link check over four nodes (two stay)",
    r"test_report_plots.py::test_a_kill_9_mid_draw": "reports killed mid-draw, many times",
    r"test_gpu_lease.py::test_a_lease_on_cpu": "the lease script's whole plan on CPU",
    r"test_gpu_lease.py::test_an_item_still_running": "the lease's budget timer",
    r"test_gpu_check.py::test_table_workers_auto": "the GPU check's worker search on CPU",
    r"test_gpu_check.py::test_the_items_no_other_test_runs": "the GPU check's items that no "
                                                             "other test runs, on CPU",
    r"test_mllog.py::test_the_log_is_mlperfs": "MLPerf's log (its abort path stays)",
    # more runs of what make test already trains once
    r"test_device_loader.py::test_speed_flags": "torch.compile on CPU (a minute)",
    r"test_horovod.py::test_horovod_compile_warm_up": "torch.compile under horovod",
    r"test_verify.py::test_a_compiled_run_is_verified": "torch.compile of ResNet-18 in two "
                                                         "ranks and the reference",
    r"test_horovod.py::test_horovod_fp16_compression": "a horovod option",
    r"test_sampler.py::test_order_digest_hashes": "the order digest under every loader",
    r"test_sampler.py::test_horovod_serves": "horovod's data order",
    r"test_fsdp.py::test_fsdp_uneven": "fsdp's padded test shards",
    r"test_cpu_syncbn.py::test_bf16_with_cpu_syncbn_compiles": "torch.compile of bench's "
                                                               "CPU SyncBatchNorm in bf16",
    r"test_cpu_syncbn.py::test_batchnorm_without_weight_and_bias": "CPU SyncBatchNorm "
                                                                   "without affine weights",
    r"test_verify.py::test_bf16_at_three_ranks": "verify at three ranks (two stay)",
    r"test_cpu_syncbn.py::test_the_bf16_reference_cuts": "the bf16 reference's convolutions "
                                                         "(its batch norm stays)",
    r"test_multinode.py::test_nodes_that_differ_only": "two nodes met without an id (the "
                                                       "two-node run stays)",
    r"test_images.py::test_a_sweep_of_another_image_folder": "a second image folder's sweep",
    r"test_fsdp.py::test_fsdp_bf16": "fsdp's bf16",
    r"test_models.py::test_a_torchvision_model_trains": "a torchvision model",
    r"test_images.py::test_a_loader_worker_that_never_serves": "a loader worker's timeout",
    r"test_images.py::test_an_imagefolder_trains_exactly": "ImageFolder against one process",
    r"test_images.py::test_a_torchvision_model_at_another": "another image size",
    r"test_images.py::test_a_decompression_bomb": "another image that does not decode",
    r"test_multinode.py::test_horovod_hosts": "horovodrun's hosts",
    r"test_loader_sweep.py::test_more_workers_feed": "bench loader's worker sweep",
    r"test_where_time_goes.py::test_bench_probe_measures_the_gradient": "a probe per model",
    r"test_ddp_options.py::test_grad_accum_is_recorded": "accumulation's record (its "
                                                          "training stays)",
    r"test_where_time_goes.py::test_a_slow_link_waits_in_front": "a hook behind a slow link "
                                                                  "(the compute step stays)",
    r"test_runs.py::test_a_target_not_reached": "a missed target (mllog's abort stays)",
    r"test_hangup.py::test_nohup_keeps": "nohup (SIGHUP closing a run stays)",
    r"test_report_flags.py::test_more_cpu_processes_than_cores": "an oversubscribed run",
    r"test_failures.py::test_a_rank_dying_after_the_record": "a rank dying late",
    r"test_kill.py::test_kill_9_of_bench_probe": "kill -9 of a probe (of a run stays)",
    r"test_a_stopped_rank_ends_the_run_within_the_timeout_and_ten_seconds\[ddp\]":
        "a stopped rank: the timeout path of test_hanging_rank_is_ended_by_the_timeout",
    r"test_ddp_options.py::test_knobs_are_recorded": "DDP's knobs recorded (built: stays)",
    r"test_unwritable.py::test_an_mllog_that_cannot_be_written": "an unwritable log (a full "
                                                                 "disk stays)",
    r"test_hangup.py::test_a_closed_terminal": "a closed terminal: SIGHUP, which stays",
    r"test_hangup.py::test_sighup_ends_a_sweep": "SIGHUP to a sweep (SIGTERM's stays)",
    r"test_failures.py::test_a_failed_rank_ends_the_run_while": "a failed rank beside a "
                                                                "stopped one",
    r"test_sweep.py::test_a_combination_named_twice": "a sweep's duplicate combination",
    r"test_data.py::test_a_synthetic_set_beyond": "a larger synthetic set",
    r"test_multinode.py::test_slurm_tasks_train_together": "Slurm's variables by hand (the "
                                                           "real Slurm's job stays)",
    r"test_kill.py::test_a_rank_killed_by_a_signal_is_named\[ddp\]": "a rank killed: named "
                                                                       "by the serial test",
    r"test_kill.py::test_a_rank_killed_outright_is_the_cause": "a restart after a rank "
    "killed outright (one after a rank that raised stays)",
    r"test_failures.py::test_a_rank_that_hangs_alone_is_ended_for": "a restart after a rank "
    "hanging alone (the watchdog's end of it and a restart after a raise stay)",
    r"test_multinode.py::test_a_rank_stopped_on_one_node": "a stopped rank on one of two "
    "nodes (two nodes, the watchdog's end of a stopped rank and a restart each stay)",
    r"test_ghost_batchnorm.py::test_bench_verify_checks_a_ghost": "verify of a ghost "
    "BatchNorm run (the layer against torch's BatchNorm stays)",
    r"test_cpu_syncbn.py::test_a_bf16_batch_is_normalised": "CPU SyncBatchNorm's bf16 "
    "rounding (its float64 check over two ranks stays)",
    r"test_failures.py::test_bench_probe_leaves_nothing_in_the_temporary": "a probe's "
    "temporary files (a run's stay)",
    r"test_models.py::test_a_user_factory_trains_under_each_strategy\[ddp\]": "a user "
    "factory under ddp (dp's stays; the compile warm-up's ddp run builds one too)",
    r"test_sigterm_keeps_finished_epochs_and_says_so_in_one_line\[dp\]": "SIGTERM under dp "
    "(ddp's stays)",
    r"test_a_raising_rank_prints_its_own_traceback_once_and_keeps_it\[dp\]": "a raise under "
    "dp (ddp's stays)",
    r"test_sighup_closes_the_run_as_sigterm_does\[dp\]": "SIGHUP under dp (ddp's stays)",
    r"test_cpu_syncbn.py::test_two_cpu_ranks_normalise": "CPU SyncBatchNorm alone against "
    "BatchNorm (verify of ddp with it against one process, in float64, stays)",
    # measurements a neighbour's load moves (serial: they run alone)
    r"test_project.py::test_the_model_predicts_measured_runs": "predictions within 15 %",
    r"test_project.py::test_one_process_records_when_each_gradient": "gradient timing",
    r"test_where_time_goes.py::test_exposed_communication_responds": "exposed communication",
    r"test_where_time_goes.py::test_loader_alone_finds": "the loader's own rate",
    r"test_sweep.py::test_sweep_run_timeout_records_failure": "a sweep's run timeout",
    r"test_kill_9_during_start_up_leaves_nothing_running\[ddp-2": "kill -9 later in start-up "
                                                                   "(at 0 s stays)",
}
PATTERNS = [re.compile(p) for p in LONG]

# Tests of a minute or more (2026-11-28, fresh clones), handed out first, so that no
# worker ends the run alone with one while the other has nothing left (the suite is handed
# out as it goes; only the last test handed out can leave a worker idle at the end). One
# that matches no test is caught by tests/test_tiers.py.
FIRST = (
    r"test_fit.py::test_a_sweep_at_the_largest",  # 190-220 s
    r"test_parity.py::test_the_self_test_sees",  # 145-160 s
)
FIRST_PATTERNS = [re.compile(p) for p in FIRST]


# CI runs `make test` and one share of the long tier (`--long-share K/N`, tests/conftest.py;
# .ci/run picks K from the commit): every long test in one of SHARES shares, each run on about
# one landing in SHARES, all of them by `make test TIER=all` or `make test-long`. A share is a
# test's node id hashed, except the heavy tests below, dealt out so that no share holds two
# of the largest: the seconds each adds to CI's wall time (2026-12-03, TIER=all on 2 cores,
# compile cache empty; a parallel-phase test's time halved: two run at once). The rest add
# 1 to 13 s each. One that matches no long test is caught by tests/test_tiers.py.
SHARES = 5
HEAVY = {
    r"test_fit.py::test_a_sweep_at_the_largest": 130,
    r"test_parity.py::test_the_self_test_sees": 108,
    r"test_project.py::test_the_model_predicts_measured_runs": 91,  # serial
    r"test_verify.py::test_a_compiled_run_is_verified": 45,
    r"rate_of_their_links\[4-50\]": 49,  # serial
    r"test_testbed.py::test_the_projection_predicts": 39,
    r"test_verify.py::test_verify_passes_every_cpu_strategy": 31,
    r"test_gpu_check.py::test_the_items_no_other_test_runs_pass_on_cpu\[options-fastest": 31,
    r"test_where_time_goes.py::test_loader_alone_finds": 28,  # serial
    r"test_slurm.py::test_exclusive_array_tasks": 28,
    r"test_cpu_syncbn.py::test_bench_verify_holds_bf16": 27,
    r"test_gpu_check.py::test_the_items_no_other_test_runs_pass_on_cpu\[variants-selftest": 26,
    r"test_fit.py::test_the_batch_found": 26,
    r"test_verify.py::test_self_test_catches_every_broken_variant": 26,
    r"test_where_time_goes.py::test_exposed_communication_responds": 25,  # serial
    r"test_report_plots.py::test_a_kill_9_mid_draw": 25,
    r"test_slurm.py::test_a_cancelled_array_task": 24,
    r"test_cpu_syncbn.py::test_bf16_with_cpu_syncbn_compiles": 23,
    r"test_slurm.py::test_a_sweep_runs_as_job_arrays": 23,
}
HEAVY_PATTERNS = [re.compile(p) for p in HEAVY]


@functools.cache
def _dealt(shares: int) -> tuple[int, ...]:
    """The share (0-based) of each of HEAVY's entries, in its order: each, largest first, to
    the share that holds the fewest seconds so far (the first of them on a tie)."""
    seconds = list(HEAVY.values())
    held = [0] * shares
    share_of = [0] * len(seconds)
    for i in sorted(range(len(seconds)), key=lambda i: -seconds[i]):
        share_of[i] = held.index(min(held))
        held[share_of[i]] += seconds[i]
    return tuple(share_of)


def long_share(nodeid: str, shares: int = SHARES) -> int:
    """Which of ``shares`` shares of the long tier holds the test of this node id (1 to
    ``shares``): a heavy one's as dealt, any other's by the hash of its id (an xdist group's
    suffix left out)."""
    for pattern, share in zip(HEAVY_PATTERNS, _dealt(shares)):
        if pattern.search(nodeid):
            return share + 1
    return zlib.crc32(nodeid.partition("@")[0].encode()) % shares + 1


def is_long(nodeid: str) -> bool:
    """Whether `make test` leaves the test of this node id to `make test-long`."""
    return any(p.search(nodeid) for p in PATTERNS)


def first_rank(nodeid: str) -> int:
    """Where a test goes in the order the suite is handed out: its place in FIRST, else
    after all of them (a stable sort keeps the rest in file order)."""
    return next((i for i, p in enumerate(FIRST_PATTERNS) if p.search(nodeid)), len(FIRST))

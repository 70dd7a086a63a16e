"""PlannerConfig and WorkerConfig: the commands' flags, the configs and LocalCluster's processes agree."""

from __future__ import annotations

import dataclasses

import pytest

from clasp import cli
from clasp.local.cluster import LocalCluster
from clasp.runtime.config import ConfigError, PlannerConfig, WorkerConfig


def parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


def test_the_commands_defaults_are_the_configs_defaults():
    # Where the command differs on purpose: a fixed port to dial, and the user's state directory (resolved
    # when the planner starts); every other default is the config's.
    assert PlannerConfig.from_args(parse("planner")) == PlannerConfig(port=5555)
    assert WorkerConfig.from_args(parse("worker", "--planner", "tcp://h:1")) == WorkerConfig(planner="tcp://h:1")


def test_a_planner_config_survives_its_flags():
    config = PlannerConfig(host="10.0.0.1", port=0, metrics_port=9100, metrics_host="0.0.0.0", advertise="a.b",
                           state_port=7000, heartbeat=0.5, dead_after=2.0, max_inflight=123, dispatch_batch=77,
                           max_queued=1000, max_queued_bytes=1 << 20, max_queue_delay=0.0, p_max=3,
                           migration_timeout=9.0, autoscale=False, rebalance=False, policy="faasflow", warmup=5,
                           state="remote",
                           checkpoint_interval=0.25, state_dir="/tmp/s", collected_memory=1 << 20, provider="local",
                           min_workers=2,
                           max_workers=6, pool_cooldown=3.0, statefulset="sts")
    changed = {f.name for f in dataclasses.fields(config) if getattr(config, f.name) != f.default}
    settable = set(PlannerConfig.FLAGS) - {"port"}  # the port is 0, its default, and still given
    assert changed == settable, "the case covers every flag"
    assert PlannerConfig.from_args(parse("planner", *config.flags())) == config


def test_a_worker_config_survives_its_flags():
    config = WorkerConfig(planner="tcp://p:5555", host="10.0.0.2", data_port=1, state_port=2, metrics_port=3,
                          metrics_host="0.0.0.0", advertise="w.b", worker_id="w7", p_max=4, flush_delay=0.004,
                          max_batch=50, cpus=0.5, leave_timeout=20.0, state_dir="/tmp/s")
    assert WorkerConfig.from_args(parse("worker", *config.flags())) == config


def test_a_setting_without_a_flag_is_refused_where_flags_are_needed():
    assert PlannerConfig(rpc_timeout=3.0).rpc_timeout == 3.0  # in-process it is a setting like any other
    with pytest.raises(ConfigError, match="rpc_timeout has no command-line flag"):
        PlannerConfig(rpc_timeout=3.0).flags()
    with pytest.raises(ConfigError, match="heartbeat has no command-line flag"):
        WorkerConfig(heartbeat=2.0).flags()


def test_no_state_directory_means_no_checkpoints_for_the_command_too():
    # In-process a planner without a state directory keeps no checkpoints; the command would pick the user's.
    flags = PlannerConfig().flags()
    assert PlannerConfig.from_args(parse("planner", *flags)).checkpoint_interval == 0
    assert PlannerConfig.from_args(parse("planner", *PlannerConfig(checkpoint_interval=0).flags())
                                   ).checkpoint_interval == 0


def test_bad_values_are_refused():
    with pytest.raises(ConfigError, match="state must be one of local, remote"):
        PlannerConfig(state="cloud")
    with pytest.raises(ConfigError, match="checkpoint_interval"):
        PlannerConfig(checkpoint_interval=-1)


def test_the_local_cluster_owns_its_state_directory():
    for kw in ({"planner_config": PlannerConfig(state_dir="/tmp/x")}, {"worker_config": WorkerConfig(state_dir="/x")},
               {"planner_args": ["--state-dir", "/tmp/x"]}):
        with pytest.raises(ValueError, match="as state_dir="):
            LocalCluster(workers=1, **kw)


def test_the_local_cluster_gives_its_processes_the_configs_and_its_own_settings():
    cl = LocalCluster(workers=2, port=0, p_max=4, planner_config=PlannerConfig(autoscale=False, warmup=7),
                      worker_config=WorkerConfig(max_batch=9), planner_args=["--heartbeat", "0.5"],
                      provider="local", max_workers=3, cpu_per_worker=[0.5, 0.25], insecure=True)
    cl.state_dir = "/tmp/state"
    cl.worker_ids = ["w0", "w1"]
    cl._addresses = {"planner": "127.0.0.1", "w0": "127.0.0.2", "w1": "127.0.0.3"}
    cl.planner = "tcp://127.0.0.1:6000"
    planner = parse(*cl._planner_args())
    assert PlannerConfig.from_args(planner) == PlannerConfig(
        port=0, p_max=4, autoscale=False, warmup=7, heartbeat=0.5, state_dir="/tmp/state", provider="local",
        max_workers=3)
    assert planner.insecure
    worker = WorkerConfig.from_args(parse(*cl._worker_args("w1")))
    assert worker == WorkerConfig(planner=cl.planner, host="127.0.0.3", worker_id="w1", p_max=4, max_batch=9,
                                  cpus=0.25, state_dir="/tmp/state")

"""The planner's and the worker's settings as typed values: `PlannerConfig` and `WorkerConfig`.

One definition serves every way a process is configured: `clasp planner` / `clasp worker` build one from
their flags (`from_args`), `LocalCluster` turns one back into the flags of the process it starts (`flags`),
and tests and embedders pass one to `Planner(...)` / `Worker(...)` directly. What cannot travel as a flag
(the CURVE keys, a provider object, a placement function) is passed to the constructors beside it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from clasp.core.credit import DEFAULT_MAX_QUEUE_DELAY, DEFAULT_MAX_QUEUED, DEFAULT_MAX_QUEUED_BYTES
from clasp.runtime.sources import WINDOW as SOURCE_WINDOW

STATE_MODES = ("local", "remote")  # where keyed state lives: on the workers, or on the planner's state server


class ConfigError(ValueError):
    """A setting out of its range, or one that has no command-line flag where flags are needed."""


def _flags(config: Any, names: dict[str, str]) -> list[str]:
    """The flags of the fields that differ from their defaults (`names`: field -> flag); booleans as
    `--flag` / `--no-flag`. A changed field without a flag cannot reach a process: ConfigError."""
    out: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value == f.default:
            continue
        flag = names.get(f.name)
        if flag is None:
            raise ConfigError(f"{type(config).__name__}.{f.name} has no command-line flag; it can only be set "
                              "in-process")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif value is not None:
            out += [flag, str(value)]
    return out


def _from_args(cls, args: Any, renamed: dict[str, str], **overrides):
    """A config from an argparse namespace: every field whose flag the parser has (`renamed`: field -> the
    namespace's name where they differ), then `overrides`."""
    values = {}
    for f in dataclasses.fields(cls):
        name = renamed.get(f.name, f.name)
        if hasattr(args, name):
            values[f.name] = getattr(args, name)
    return cls(**{**values, **overrides})


@dataclass(frozen=True)
class PlannerConfig:
    """Everything `clasp planner` can be told. Times in seconds; queue bounds per job."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: a free one (`clasp planner` defaults to 5555)
    metrics_port: int = 0
    metrics_host: str | None = None  # None: `host`
    advertise: str | None = None  # the address others dial when `host` is a wildcard
    state_port: int = 0  # the remote-state server's
    heartbeat: float = 1.0  # workers' metrics heartbeats and the planner's control ticks
    dead_after: float = 5.0  # heartbeat silence that marks a worker dead
    # A worker whose data connection dropped and that sent no heartbeat for this long is dead.
    dead_after_disconnect: float = 1.0
    max_inflight: int | None = None  # None: per worker of the job (`scheduler.dispatch_limits`)
    dispatch_batch: int | None = None
    max_queued: int = DEFAULT_MAX_QUEUED
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    max_queue_delay: float = DEFAULT_MAX_QUEUE_DELAY
    p_max: int = 10  # executor slots per worker that placements assume
    rpc_timeout: float = 10.0
    migration_timeout: float = 5.0
    autoscale: bool = True
    rebalance: bool = True  # key groups follow their measured load (`clasp.core.control.Rebalancer`)
    policy: str = "clasp"
    warmup: int = 10_000  # requests a job completes before its first re-plan (`ControlConfig.warmup_requests`)
    state: str = "local"  # STATE_MODES
    checkpoint_interval: float = 1.0  # 0: no checkpoints
    state_dir: str | None = None  # checkpoints and the input log; None: none kept
    input_log_records: int = 1_000_000  # input records the planner keeps in memory before spilling to disk
    # bytes of a job's collected outputs, released by checkpoints, the planner keeps in memory; older ones are
    # read back from their checkpoint files when asked for
    collected_memory: int = 64 << 20
    # The elastic pool (docs/DEPLOY.md): what starts and stops workers, and its bounds.
    provider: str = "static"
    min_workers: int = 1
    max_workers: int | None = None
    pool_cooldown: float = 10.0
    statefulset: str = "clasp-worker"

    FLAGS = {"host": "--host", "port": "--port", "metrics_port": "--metrics-port", "metrics_host": "--metrics-host",
             "advertise": "--advertise", "state_port": "--state-port", "heartbeat": "--heartbeat",
             "dead_after": "--dead-after", "max_inflight": "--max-inflight", "dispatch_batch": "--dispatch-batch",
             "max_queued": "--max-queued", "max_queued_bytes": "--max-queued-bytes",
             "max_queue_delay": "--max-queue-delay", "p_max": "--p-max", "migration_timeout": "--migration-timeout",
             "autoscale": "--autoscale", "rebalance": "--rebalance", "policy": "--policy", "warmup": "--warmup",
             "state": "--state",
             "checkpoint_interval": "--checkpoint-interval", "state_dir": "--state-dir",
             "collected_memory": "--collected-memory", "provider": "--provider",
             "min_workers": "--min-workers", "max_workers": "--max-workers", "pool_cooldown": "--pool-cooldown",
             "statefulset": "--statefulset"}

    def __post_init__(self) -> None:
        if self.state not in STATE_MODES:
            raise ConfigError(f"state must be one of {', '.join(STATE_MODES)}, not {self.state!r}")
        if self.checkpoint_interval < 0:
            raise ConfigError(f"checkpoint_interval must be >= 0, not {self.checkpoint_interval}")

    def flags(self) -> list[str]:
        """`clasp planner`'s flags for this configuration (those that differ from the defaults above). The port
        always (the command's default is 5555); without a state directory, checkpoints off (the command's
        default directory is the user's, where this configuration keeps none)."""
        config = self
        if config.state_dir is None and config.checkpoint_interval > 0:
            config = dataclasses.replace(config, checkpoint_interval=0.0)
        return ["--port", str(config.port), *_flags(dataclasses.replace(config, port=0), self.FLAGS)]

    @classmethod
    def from_args(cls, args: Any, **overrides) -> PlannerConfig:
        """From `clasp planner`'s (or `clasp cluster`'s) parsed arguments."""
        return _from_args(cls, args, {}, **overrides)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything `clasp worker` can be told. Times in seconds."""

    planner: str = ""  # the planner's endpoint, tcp://HOST:PORT
    host: str = "127.0.0.1"
    data_port: int = 0  # 0: a free one
    state_port: int = 0
    metrics_port: int = 0
    metrics_host: str | None = None  # None: `host`
    advertise: str | None = None
    worker_id: str | None = None  # None: a random one
    p_max: int = 10  # executor slots
    heartbeat: float = 1.0
    flush_delay: float = 0.001  # the longest a remote chained request waits for its batch
    max_batch: int = 2000  # rows that flush a batch at once, whatever its age
    cpus: float | None = None  # None: the process's cgroup quota, if any
    leave_timeout: float = 300.0  # after SIGTERM: the longest wait for the planner's drain, then exit 1
    state_dir: str | None = None  # checkpoints; None: the directory the planner names
    source_window: int = SOURCE_WINDOW  # records its source readers may have in flight

    FLAGS = {"planner": "--planner", "host": "--host", "data_port": "--data-port", "state_port": "--state-port",
             "metrics_port": "--metrics-port", "metrics_host": "--metrics-host", "advertise": "--advertise",
             "worker_id": "--id", "p_max": "--p-max", "max_batch": "--max-batch", "cpus": "--cpus",
             "leave_timeout": "--leave-timeout", "state_dir": "--state-dir", "source_window": "--source-window"}

    def flags(self) -> list[str]:
        """`clasp worker`'s flags for this configuration (those that differ from the defaults above)."""
        out = _flags(dataclasses.replace(self, flush_delay=WorkerConfig.flush_delay), self.FLAGS)
        if self.flush_delay != WorkerConfig.flush_delay:  # the flag is in milliseconds
            out += ["--flush-delay-ms", str(self.flush_delay * 1000.0)]
        return out

    @classmethod
    def from_args(cls, args: Any, **overrides) -> WorkerConfig:
        """From `clasp worker`'s parsed arguments."""
        if hasattr(args, "flush_delay_ms"):
            overrides.setdefault("flush_delay", args.flush_delay_ms / 1000.0)
        return _from_args(cls, args, {"worker_id": "id"}, **overrides)

"""The Ray executor (`loop.executor: ray`, the ray extra): each arm a Ray task running the same pure arm
function as the process executor, on a local Ray node or on the cluster at RAY_ADDRESS.

A batch of arms (a race, a confirmation) is gang-scheduled: one placement group holds a bundle of
`loop.ray_cpus_per_arm` CPUs (and `ray_gpus_per_arm` GPUs) per arm, reserved all at once, so no arm
starts while its siblings wait half-placed behind another job. The group is sized to what the cluster
can hold; when that is fewer bundles than arms, the extra arms queue inside the group and take a bundle
as one frees (four 1-CPU arms on a 2-CPU node run two at a time), never a group that cannot be placed.
Strategy PACK: each bundle carries its arm's whole CPU (and GPU) reservation, so packing never
oversubscribes a node; it keeps a batch on as few nodes as possible (fewer nodes read the parent
checkpoint from shared storage) and leaves whole nodes free for other work, and unlike STRICT_PACK it
still spreads over nodes when one cannot hold the batch.

A worker or node lost under an arm (killed, out of memory, a dead node) costs one retry (Ray's
max_retries); a second loss stops the stage with InfrastructureError, after the batch's other arms are
cancelled, so nothing of the stage is still writing when the loop stops. Retention prunes only after
a round is decided, which is after its executor calls return: a running arm's parent is never pruned.
A resume redoes the stage; the arms that finished keep their results (run_arm's result files)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from evotrainer.backtest.trial import ArmResult, ArmSpec, run_arm_in_worker
from evotrainer.errors import ConfigError, InfrastructureError, UserError

RETRIES = 1
"""Ray reruns an arm whose worker or node was lost this many times (an exception the arm raises itself
is never retried: it would fail again)."""
CANCEL_WAIT_SECONDS = 60.0
"""How long a failed batch waits for its cancelled arms to stop before the error is raised."""


def connect(num_cpus: int | None = None) -> None:
    """Join the Ray cluster at RAY_ADDRESS, or start a local node with `num_cpus` CPUs (None: all of this
    machine's). Without RAY_ADDRESS the node is always a new one ("local"): ray.init() alone would join
    whatever Ray instance another program left running on this machine. Ray's usage statistics are off
    unless the user turned them on (RAY_USAGE_STATS_ENABLED)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = os.environ.get("RAY_ADDRESS") or "local"
    # A cluster's resources are its own: num_cpus and the dashboard are only for a node we start.
    local = {"num_cpus": num_cpus, "include_dashboard": False} if address == "local" else {}
    try:
        ray.init(address=address, **local)
    except ConnectionError as e:
        raise ConfigError(
            f"loop.executor: ray cannot join the Ray cluster at RAY_ADDRESS={address} ({e}); start it, fix "
            "RAY_ADDRESS, or unset RAY_ADDRESS to run on a local Ray node"
        ) from None


def check_shared_storage(spec: ArmSpec) -> None:
    """On the worker, before anything else: the checkpoints the arm forks from must be visible here. A
    worker on a node without the run directory fails at once, naming the path, and is not retried."""
    for path in (spec.start, spec.reference):
        if path is not None and not (Path(path).is_dir() and os.access(path, os.R_OK)):
            raise ConfigError(
                f"run.out_dir: the Ray worker on {socket.gethostname()} cannot read the parent checkpoint {path} "
                f"of arm {spec.branch}; the run directory ({spec.run_dir}) must be on shared storage that every "
                "Ray node mounts at the same path"
            )


@ray.remote(max_retries=RETRIES)
def arm_task(spec: ArmSpec, threads: int) -> dict[str, Any]:
    """One arm as a Ray task (its worker's process title is `ray::arm_task`)."""
    check_shared_storage(spec)
    return run_arm_in_worker(spec, threads)


class RayExecutor:
    """Arms as Ray tasks, each batch in one placement group (see the module's docstring)."""

    def __init__(self, cpus_per_arm: int, gpus_per_arm: float = 0.0):
        connect()
        self.cpus, self.gpus = cpus_per_arm, gpus_per_arm
        self.bundle = {"CPU": float(cpus_per_arm), **({"GPU": gpus_per_arm} if gpus_per_arm else {})}
        self.at_once(1)  # an arm no node can hold is a config mistake: said now, before the run is written

    def at_once(self, arms: int) -> int:
        """How many of `arms` arms the cluster's live nodes can hold at once (each arm on one node)."""
        fit = 0
        for node in ray.nodes():
            have = node["Resources"] if node["Alive"] else {}
            n = int(have.get("CPU", 0) // self.cpus)
            fit += min(n, int(have.get("GPU", 0) // self.gpus)) if self.gpus else n
        if fit < 1:
            total = ray.cluster_resources()
            raise ConfigError(
                f"loop.ray_cpus_per_arm={self.cpus}, loop.ray_gpus_per_arm={self.gpus}: no node of the Ray cluster "
                f"can hold one arm (the cluster has {total.get('CPU', 0):g} CPUs and {total.get('GPU', 0):g} GPUs); "
                "lower them or add nodes"
            )
        return min(arms, fit)

    def run(self, specs: list[ArmSpec], started: Callable[[ArmSpec], None] | None = None) -> list[ArmResult]:
        if not specs:
            return []
        group = placement_group([self.bundle] * self.at_once(len(specs)), strategy="PACK")
        try:
            ray.get(group.ready())  # all bundles or none: waits while other work holds the cluster
            refs = []
            for s in specs:
                if started:
                    started(s)
                refs.append(self._submit(s, group))
            return [ArmResult(**r) for r in _gather(refs, specs)]
        finally:
            remove_placement_group(group)

    def _submit(self, spec: ArmSpec, group: PlacementGroup):
        strategy = PlacementGroupSchedulingStrategy(placement_group=group)  # any bundle of the group
        return arm_task.options(num_cpus=self.cpus, num_gpus=self.gpus, scheduling_strategy=strategy).remote(
            spec, self.cpus
        )


def _gather(refs: list, specs: list[ArmSpec]) -> list[dict[str, Any]]:
    """The arms' results in order. The first failure cancels the arms still running and is raised: an
    error the arm raised as itself (a UserError without Ray's wrapping), a lost worker or node as
    InfrastructureError."""
    spec_of = dict(zip(refs, specs))
    pending = list(refs)
    try:
        while pending:
            [done], pending = ray.wait(pending, num_returns=1)
            ray.get(done)  # raises now, not after the slowest sibling
        return ray.get(refs)
    except RayTaskError as e:
        if isinstance(e.cause, UserError):
            raise e.cause from None
        raise
    except RayError as e:
        spec = spec_of[done]
        why = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
        raise InfrastructureError(
            f"arm {spec.branch}: Ray lost it ({why}), after {RETRIES} retry of a lost worker or node; the run "
            f"stops here and `evotrainer resume {spec.run_dir}` redoes the stage (arms that finished keep their "
            "results)"
        ) from e
    finally:
        for r in pending:
            ray.cancel(r, force=True)
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=CANCEL_WAIT_SECONDS)

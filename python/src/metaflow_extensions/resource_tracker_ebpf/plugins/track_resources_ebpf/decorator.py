"""@track_resources for Metaflow steps, on the resource-tracker binary.

The step's task process is tracked (with every process it starts) from before the
user code to after it; the data goes into an artifact (default
`resource_tracker_data`) and a card `resource_tracker_<step>` is added, rendered for
failed steps too. With `cpus` and/or `memory`, a local run starts the task under
the binary's `run --cpus/--memory` (a cgroup with that CPU quota and memory limit),
so that a recommendation can be tried on the step itself.
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Dict, List, Optional

from metaflow.decorators import StepDecorator

HISTORY_RUNS = 5
# Decorators that run the task elsewhere: there @resources sizes it, and a limit
# put on the local process that launches it would limit nothing of the step.
REMOTE = ("kubernetes", "batch", "slurm", "nvidia", "parallel")


def _error(e: BaseException) -> Dict[str, str]:
    return {
        "error_type": type(e).__name__,
        "error_message": str(e),
        "traceback": traceback.format_exc(),
    }


def _ebpf_choice(value: Any) -> Optional[bool]:
    """The `ebpf` attribute: None lets the binary choose. A `--with` spec may
    give it as a string ("False" is not true)."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"ebpf={value!r}: not true or false")


def _limits(cpus: Any, memory: Any) -> List[str]:
    """The binary's `run` flags for the `cpus` and `memory` attributes (a
    `--with` spec gives them as strings); the binary checks them against the
    host. A value that is no limit at all raises, naming it."""
    flags: List[str] = []
    if cpus is not None and str(cpus).strip() != "":
        try:
            n = float(cpus)
        except (TypeError, ValueError):
            raise ValueError(f"cpus={cpus!r}: not a number of CPUs") from None
        if not n > 0 or n != n or n == float("inf"):
            raise ValueError(f"cpus={cpus!r}: must be a positive number of CPUs")
        flags += ["--cpus", repr(n) if n != int(n) else str(int(n))]
    if memory is not None and str(memory).strip() != "":
        text = str(memory).strip()
        # A bare number is MiB, as in @resources(memory=...).
        flags += ["--memory", text + "M" if text.replace(".", "", 1).isdigit() else text]
    return flags


class TrackResourcesEbpfDecorator(StepDecorator):
    """Track the resources a step uses with resource-tracker-ebpf."""

    name = "track_resources_ebpf"
    attrs = {
        "interval": {"type": float},
        "artifact_name": {"type": str},
        "create_card": {"type": bool},
        "pss": {"type": bool},
        "ebpf": {"type": bool},
        "cpus": {"type": float},
        "memory": {"type": str},
    }
    defaults = {
        "interval": 1.0,
        "artifact_name": "resource_tracker_data",
        "create_card": True,
        "pss": False,
        # None: the binary chooses (eBPF where it may, else procfs); False: procfs.
        "ebpf": None,
        # A local run's task under a CPU quota and a memory limit (MiB, or "2G").
        "cpus": None,
        "memory": None,
    }

    def __init__(self, attributes=None, statically_defined=False, inserted_by=None):
        self.error_details: Optional[Dict[str, str]] = None
        self.tracker = None
        self.card_name = None
        try:
            super().__init__(attributes, statically_defined, inserted_by)
        except TypeError:  # Metaflow versions without inserted_by
            super().__init__(attributes, statically_defined)

    def step_init(self, flow, graph, step_name, decorators, environment, flow_datastore, logger):
        self.logger = logger
        # Checked before anything runs: a step is never run without the limits it
        # was given (a bad value stops the run, naming it).
        from metaflow.exception import MetaflowException

        try:
            self.limit_flags = _limits(self.attributes["cpus"], self.attributes["memory"])
        except ValueError as e:
            raise MetaflowException(f"@{self.name} on step {step_name}: {e}") from None
        remote = [d.name for d in decorators if getattr(d, "name", None) in REMOTE]
        if self.limit_flags and remote:
            logger(
                f"*NOTE* [@{self.name}] step {step_name} runs under @{remote[0]}: its cpus and "
                "memory limits apply to local runs only; @resources sizes it there",
                timestamp=False,
            )
            self.limit_flags = []
        if not self.attributes["create_card"]:
            return
        self.card_name = "resource_tracker_" + step_name
        if any(
            getattr(d, "name", None) == "card"
            and (getattr(d, "attributes", None) or {}).get("id") == self.card_name
            for d in decorators
        ):
            return
        from metaflow.plugins.cards.card_decorator import CardDecorator

        decorators.append(
            CardDecorator(
                attributes={
                    "type": "tracked_resources_ebpf",
                    "id": self.card_name,
                    "options": {"artifact_name": self.attributes["artifact_name"]},
                }
            )
        )

    def runtime_step_cli(self, cli_args, retry_count, max_user_code_retries, ubf_context):
        """A local run's task starts under the binary's `run` with the limits: the
        binary makes the task a cgroup with the CPU quota and memory limit, says
        in the task's log whether it fit (OOM kills, throttling), and exits with
        the task's code (137 when the limit's OOM killer ended it). Where it
        cannot make the cgroup (no rights) it says why and the task fails
        without running."""
        if not getattr(self, "limit_flags", None):
            return
        from resource_tracker_ebpf._binary import find_binary

        # Samples go nowhere, one a minute, on procfs (no second set of kernel
        # programs): the step's own tracker, inside, takes the figures, from the
        # cgroup that holds exactly the task.
        wrap = [str(find_binary(None)), "run", "--no-ebpf", "-i", "60", "-o", "/dev/null", *self.limit_flags, "--"]
        cli_args.entrypoint = wrap + list(cli_args.entrypoint)

    def task_pre_step(
        self,
        step_name,
        task_datastore,
        metadata,
        run_id,
        task_id,
        flow,
        graph,
        retry_count,
        max_user_code_retries,
        ubf_context,
        inputs,
    ):
        try:
            from resource_tracker_ebpf import ResourceTracker

            self.tracker = ResourceTracker(
                interval=float(self.attributes["interval"]),
                pss=bool(self.attributes["pss"]),
                ebpf=_ebpf_choice(self.attributes["ebpf"]),
                job_name=f"{flow.name}/{step_name}",
                tags={"run_id": str(run_id), "task_id": str(task_id)},
                autostart=True,
            )
            self.start_time = time.time()
        except Exception as e:  # a tracker failure never fails the step
            self.error_details = _error(e)
            self.logger(
                f"*WARNING* [@{self.name}] the resource tracker did not start: {type(e).__name__}: {e}",
                timestamp=False,
            )

    def task_post_step(self, step_name, flow, graph, retry_count, max_user_code_retries):
        self._store(flow, step_name, failed=False)

    def task_exception(self, exception, step_name, flow, graph, retry_count, max_user_code_retries):
        self._store(flow, step_name, failed=True)

    def task_finished(self, step_name, flow, graph, is_task_ok, retry_count, max_user_code_retries):
        # Metaflow renders cards only for successful tasks: render ours for a failed
        # one here (the card decorator runs after this one and cleans up).
        if is_task_ok or not self.card_name:
            return
        try:
            for d in graph[step_name].decorators:
                if getattr(d, "name", None) == "card" and d.attributes.get("id") == self.card_name:
                    d.card_creator.create(
                        mode="render",
                        final=True,
                        card_uuid=d._card_uuid,
                        user_set_card_id=d._user_set_card_id,
                        runtime_card=d._is_runtime_card,
                        decorator_attributes=d.attributes,
                        card_options=d.card_options,
                        logger=self.logger,
                    )
                    break
        except Exception as e:
            self.logger(
                f"*WARNING* [@{self.name}] the card of the failed step was not rendered: {type(e).__name__}: {e}",
                timestamp=False,
            )

    def _store(self, flow, step_name: str, failed: bool) -> None:
        name = self.attributes["artifact_name"]
        if self.tracker is not None and self.error_details is None:
            try:
                self.tracker.stop()
            except Exception as e:
                self.error_details = _error(e)
        if self.error_details is not None:
            setattr(flow, name, {"error": self.error_details, "step_failed": failed})
            return
        try:
            snap = self.tracker.snapshot()
            if not snap["samples"] or not (snap["summary"] or {}).get("stats"):
                raise RuntimeError(
                    f"no sample taken: the step ran {time.time() - self.start_time:.2f} s, "
                    f"the interval is {self.attributes['interval']} s"
                )
            setattr(
                flow,
                name,
                {
                    "step_failed": failed,
                    "tracker": snap,
                    "history": self._history(flow, step_name),
                    "limits": getattr(self, "limit_flags", None) or None,
                },
            )
        except Exception as e:
            setattr(flow, name, {"error": _error(e), "step_failed": failed})
            self.logger(
                f"*WARNING* [@{self.name}] resource data not stored: {type(e).__name__}: {e}",
                timestamp=False,
            )

    def _history(self, flow, step_name: str) -> List[Dict[str, Any]]:
        """Stats and recommendations of this step in up to five previous successful
        runs (their snapshots stay in their own artifacts; the card fetches them for
        the report)."""
        out: List[Dict[str, Any]] = []
        try:
            from metaflow import Flow, current, get_namespace, namespace

            from resource_tracker_ebpf import ResourceTracker

            # Every earlier run of this flow, whoever ran it; the user's namespace
            # is put back afterwards.
            before = get_namespace()
            namespace(None)
            try:
                self._collect(Flow(flow.name), step_name, current.run_id, ResourceTracker, out)
            finally:
                namespace(before)
        except Exception as e:
            self.logger(f"*WARNING* [@{self.name}] no history: {type(e).__name__}: {e}", timestamp=False)
        return out

    def _collect(self, mf_flow, step_name: str, run_id: Any, tracker_cls: Any, out: List[Dict[str, Any]]) -> None:
        """Appends the newest successful earlier runs' data to `out`."""
        runs = sorted(mf_flow.runs(), key=lambda r: r.created_at, reverse=True)
        for run in runs:
            if len(out) >= HISTORY_RUNS:
                break
            if str(run.id) == str(run_id) or not run.successful:
                continue
            try:
                task = next(iter(run[step_name].tasks()))
                data = getattr(task.data, self.attributes["artifact_name"])
                if data.get("error"):
                    continue
                t = tracker_cls.from_snapshot(data["tracker"])
                out.append(
                    {
                        "run_id": str(run.id),
                        "created_at": str(run.created_at),
                        "pathspec": task.pathspec,
                        "stats": t.stats(),
                        "recommendation": t.recommend_resources(),
                        "backend": t.backend,
                        # The card combines only runs measured the same way.
                        "memory_source": t.memory_source,
                    }
                )
            except Exception as e:  # one unreadable run does not hide the others
                self.logger(
                    f"*NOTE* [@{self.name}] run {run.id} skipped in the history: {type(e).__name__}: {e}",
                    timestamp=False,
                )


class TrackResourcesDecorator(TrackResourcesEbpfDecorator):
    """The same under the Python resource-tracker package's name."""

    name = "track_resources"

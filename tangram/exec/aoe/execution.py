"""Running one action in a container: take its cores from the ledger (waiting if they are
held), write the grant, run the command, revoke however it ended, and hand what was seen to the
judge. The caller holds the container's lock; one call, one ``ActionOutcome``."""

from __future__ import annotations

import logging
import math
import numbers
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tangram.exec.aoe import environment, judge
from tangram.exec.aoe.cgroups import MIN_QUOTA_US, MIN_WEIGHT_UNITS, CgroupGone
from tangram.exec.aoe.config import MAX_OUTPUT_BYTES, MAX_TIMEOUT_S, AoeConfig
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.kill import kill_action
from tangram.exec.aoe.ledger import CoreLedger
from tangram.exec.aoe.lifecycle import Container, Lifecycle, park
from tangram.exec.aoe.records import ActionOutcome, KillReport
from tangram.exec.aoe.resize import RunningGrant
from tangram.exec.aoe.topology import format_cpulist
from tangram.exec.aoe.transport import ActionRequest, RawResult

log = logging.getLogger(__name__)

#: Called with an action's ``RunningGrant`` once its cores are granted (on the action's thread).
OnGrant = Callable[[RunningGrant], None]


@dataclass(frozen=True)
class ActionPlan:
    """A checked action: its script, the cores asked for, and its limits."""

    script: str
    cores: tuple[int, ...] | int
    quota: float
    timeout_s: float
    max_output_bytes: int
    #: The thread count the action is told (``TANGRAM_CORES``, ``OMP_NUM_THREADS``); 0: its
    #: cores. More than its cores: its threads time-slice on them until a resize grows them.
    threads: int = 0
    #: A weighted grant's pool (its cpuset; no quota, a CPU weight of ``quota`` cores); None:
    #: an exclusive grant (cpuset = its cores, CFS quota = ``quota``).
    pool: tuple[int, ...] | None = None


#: What an action id may be made of: it travels on the runner's protocol line (no spaces) and
#: into the fallback kill's script (no quotes or shell syntax). No ``~``: the ids the manager
#: makes hold one (``manager.auto_action_id``), so a caller's id never takes one of theirs.
ACTION_ID = re.compile(r"[A-Za-z0-9_.:/@+=,-]{1,256}\Z")


def plan_action(
    config: AoeConfig,
    command: str | Sequence[str],
    cores: tuple[int, ...] | int,
    quota_cores: float | None,
    timeout_s: float | None,
    max_output_bytes: int | None,
    *,
    env: Mapping[str, str] | None = None,
    action_id: str | None = None,
    threads: int = 0,
    pool: tuple[int, ...] | None = None,
) -> ActionPlan:
    """The action with the manager's defaults filled in; ``AoeError`` naming a bad argument.

    The environment and the command are held to ``environment``'s rule here, before anything
    runs, whatever the caller checked already (the service refuses the same with a 400)."""
    problem = (
        environment.env_problem(env or {})
        or environment.command_problem(command)
        or environment.script_problem(command, env or {})
    )
    if problem:
        raise AoeError(problem)
    if action_id is not None and (not isinstance(action_id, str) or not ACTION_ID.match(action_id)):
        raise AoeError(
            f"action id {action_id!r} must be 1-256 characters of letters, digits and _.:/@+=,-"
        )
    n = cores if isinstance(cores, int) else len(cores)
    _require_number("quota_cores", quota_cores, "cores' worth of CPU time")
    _require_number("timeout_s", timeout_s, "seconds")
    quota = float(n if quota_cores is None else quota_cores)
    if not 0 < quota <= n:
        raise AoeError(
            f"quota_cores must be in (0, {n}] for {n} granted core(s), got {quota_cores}"
        )
    floor = MIN_QUOTA_US / config.cfs_period_us
    if pool is None and quota < floor:
        # The kernel's least quota is 1 ms a period (``CpuControl.quota_us`` raises any less
        # to it): 1e-06 ran at 0.01 cores while the outcome and TANGRAM_CPU_QUOTA said 1e-06.
        raise AoeError(
            f"quota_cores must be at least {floor:g} (the kernel's 1 ms per "
            f"cfs_period_us={config.cfs_period_us} period), got {quota_cores}"
        )
    if pool is not None and quota < MIN_WEIGHT_UNITS:
        # A weighted grant's least weight is 1 (``weight_of`` raises any less to it): 0.001
        # cores ran at 0.01 cores' weight while the outcome said 0.001.
        raise AoeError(
            f"quota_cores of a weighted grant must be at least {MIN_WEIGHT_UNITS:g} (cpu.weight "
            f"1, the least), got {quota_cores}"
        )
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral):
        raise AoeError(f"threads must be a whole number (0: the granted cores), got {threads!r}")
    threads = int(threads)
    if threads and threads < n:
        raise AoeError(f"threads must be 0 or at least the {n} granted core(s), got {threads}")
    timeout = config.default_timeout_s if timeout_s is None else timeout_s
    if not 0 < timeout <= MAX_TIMEOUT_S:  # NaN fails it too
        raise AoeError(
            f"timeout_s must be positive and at most {MAX_TIMEOUT_S:g} s (30 days), got {timeout_s}"
        )
    limit = config.max_output_bytes if max_output_bytes is None else max_output_bytes
    if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1:
        raise AoeError(
            f"max_output_bytes must be a positive whole number of bytes, got {max_output_bytes!r}"
        )
    limit = int(limit)
    if limit > MAX_OUTPUT_BYTES:
        # (held in the manager's memory: 10**12 let a chatty action grow it without limit)
        raise AoeError(
            f"max_output_bytes must be at most {MAX_OUTPUT_BYTES} (1 GiB) per stream, got "
            f"{max_output_bytes!r}"
        )
    script = environment.command_text(command)
    if not script.strip():
        raise AoeError("command is empty")
    if pool is not None:
        pool = tuple(sorted(set(pool)))
        if isinstance(cores, int) or not set(cores) <= set(pool):
            raise AoeError(
                f"a weighted grant's cores must be given and lie in its pool "
                f"{format_cpulist(pool)}, got {cores}"
            )
    return ActionPlan(script, cores, quota, timeout, limit, threads, pool)


def ledger_key(traj_id: str, aid: str) -> str:
    """Action ``aid``'s key in the core ledger: ``<action id> of <trajectory>``. Callers
    choose action ids per trajectory, so keyed by the id alone, one trajectory's running
    "step1" made another's "step1" raise "already holds cores" (and a resize could take the
    other's cores for its own). An action id holds no space, so the key names one action of
    one trajectory."""
    return f"{aid} of {traj_id}"


def _require_number(name: str, value: object, unit: str) -> None:
    """``AoeError`` naming ``name`` unless ``value`` is None or a real number (not a bool):
    a string raised a bare ValueError or TypeError further on, naming nothing, and True
    passed as 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise AoeError(f"{name} must be a number of {unit}, got {value!r}")


def check_deadline(deadline: object) -> None:
    """``AoeError`` unless ``deadline`` is None or a ``time.monotonic`` time (a real number,
    not NaN): a NaN compared false with every time, so the action ran its whole time-out
    past it; a string raised a bare TypeError."""
    _require_number("deadline", deadline, "seconds on time.monotonic's clock")
    if isinstance(deadline, numbers.Real) and math.isnan(deadline):
        raise AoeError("deadline must be a number of seconds on time.monotonic's clock, got nan")


def action_env(
    granted: tuple[int, ...],
    quota: float,
    env: Mapping[str, str] | None,
    threads: int = 0,
    pool: tuple[int, ...] | None = None,
) -> dict:
    """The caller's own variables, then what the action sees of its grant: the grant comes
    last, so it wins even over a reserved name that got past ``plan_action``. The thread
    count it is told is ``threads`` when given. A weighted grant (``pool``) runs on the
    pool with no quota: ``TANGRAM_CPUSET`` is the pool, ``TANGRAM_CPU_QUOTA`` ``max``."""
    told = str(threads or len(granted))
    return {
        **(env or {}),
        "TANGRAM_CORES": told,
        "OMP_NUM_THREADS": told,
        "TANGRAM_CPUSET": format_cpulist(granted if pool is None else pool),
        "TANGRAM_CPU_QUOTA": f"{quota:g}" if pool is None else "max",
    }


def _oom_kills(container: Container) -> int | None:
    """The container's OOM-kill counter, None when it cannot be read (as without a memory
    controller): read between the grant and the ``try`` that frees the cores, an error here
    kept them for ever and cost the action its outcome."""
    try:
        return container.control.oom_kills()
    except (OSError, AoeError, ValueError) as exc:
        log.warning("the OOM-kill counter of %s cannot be read: %s", container.handle.short_id, exc)
        return None


def _outcome(
    traj_id: str,
    aid: str,
    plan: ActionPlan,
    t0: float,
    times: dict[str, float],
    v: judge.Verdict,
    granted: tuple[int, ...],
) -> ActionOutcome:
    """The action's one ``ActionOutcome``: the verdict, its cores, and its timings completed
    with ``total_s`` (since ``t0``) and ``overhead_s``."""
    times["total_s"] = time.perf_counter() - t0
    times["overhead_s"] = times["total_s"] - times.get("queue_s", 0.0) - times.get("exec_s", 0.0)
    return ActionOutcome(
        traj_id, aid, v.status, v.exit_code, v.stdout, v.stderr, v.error, granted, plan.quota, times
    )


class ActionRunner:
    """Carries actions through cores, grant, run and revoke; the judge decides the outcome."""

    def __init__(self, client: Any, ledger: CoreLedger, lifecycle: Lifecycle) -> None:
        self.client = client
        self.ledger = ledger
        self.lifecycle = lifecycle

    def run(
        self,
        container: Container,
        aid: str,
        plan: ActionPlan,
        env: Mapping[str, str] | None,
        t0: float,
        on_grant: OnGrant | None = None,
        deadline: float | None = None,
    ) -> ActionOutcome:
        """Run ``plan`` as action ``aid`` in ``container`` (whose lock the caller holds); ``t0``
        is when the call began (``perf_counter``), for the timings. ``on_grant`` gets the
        ``RunningGrant`` once the grant is written, before the command runs (to resize it).
        ``deadline`` (``time.monotonic``): the command's time-out is cut to what is left of
        it when the command starts, and one with nothing left ends ``timeout`` unrun."""
        traj_id = container.handle.traj_id
        times: dict[str, float] = {}

        def outcome(v: judge.Verdict, granted: tuple[int, ...]) -> ActionOutcome:
            return _outcome(traj_id, aid, plan, t0, times, v, granted)

        if container.dead:
            times["queue_s"] = time.perf_counter() - t0
            return outcome(judge.refused(container.handle.short_id, container.dead), ())
        if deadline is not None and deadline <= time.monotonic():  # (waited for the lock)
            times["queue_s"] = time.perf_counter() - t0
            return outcome(judge.late(times["queue_s"]), ())
        key = ledger_key(traj_id, aid)
        granted = self.ledger.acquire(key, plan.cores, deadline)
        # From here the cores are the action's: an interrupt (a KeyboardInterrupt) anywhere
        # below still gives them back (taken before this try, they were kept for good, and
        # every later action on them waited until its deadline, for ever without one).
        try:
            times["queue_s"] = time.perf_counter() - t0
            if granted is None:  # the deadline passed while its cores were held by others
                return outcome(judge.late(times["queue_s"]), ())
            timeout_s = plan.timeout_s
            if deadline is not None:
                timeout_s = min(timeout_s, deadline - time.monotonic())
                if timeout_s <= 0:  # it passed while the cores were waited for: never granted
                    return outcome(judge.late(times["queue_s"]), ())  # (released below)
            env_all = action_env(granted, plan.quota, env, plan.threads, plan.pool)
            request = ActionRequest(aid, plan.script, env_all, timeout_s, plan.max_output_bytes)
            oom_before = _oom_kills(container)
            kills: list[KillReport] = []
            running = RunningGrant(
                container, self.ledger, aid, granted, plan.quota, plan.pool, ledger_key=key
            )
            try:
                raw = self._granted_run(container, running, request, times, kills, on_grant)
            finally:
                running.end()  # before the park: no resize writes into a parked container
                t_revoke = time.perf_counter()
                try:
                    park(container)
                except CgroupGone:
                    pass
                except (AoeError, OSError) as exc:
                    # The cores go back all the same (kept, every later action asking for
                    # them waited for ever); the container, left running unparked, takes no
                    # more actions: a recreate or a close removes it.
                    log.warning("action %s: %s could not be parked: %s", aid, traj_id, exc)
                    stopped = self._stop(container)
                    container.dead = container.dead or (
                        f"container {container.handle.short_id} could not be parked after "
                        f"action {aid}: {exc}; {stopped}"
                    )
                finally:
                    times["revoke_s"] = time.perf_counter() - t_revoke
                    self.ledger.release(key, traj_id, plan.quota, record_as=aid)
        finally:
            # (The key is this call's alone: its trajectory's actions run one at a time.)
            if granted is not None and self.ledger.holds(key):
                self.ledger.release(key, traj_id, plan.quota, record_as=aid)
        if isinstance(raw, judge.Verdict):
            return outcome(raw, granted)  # the command never ran
        death = self._probe(container, judge.probe(raw))
        after = _oom_kills(container) if judge.wants_oom_count(raw, oom_before) else None
        facts = judge.Facts(
            max_output_bytes=plan.max_output_bytes,
            timeout_s=timeout_s,
            memory_gb=container.handle.memory_gb,
            oom_kills_before=oom_before,
            oom_kills_after=after,
            death=death,
            kill=kills[-1] if kills else None,
        )
        return outcome(judge.judge(raw, facts), granted)

    def _stop(self, container: Container) -> str:
        """Have the engine stop a container that could not be parked (its cores are given
        back: left running unfrozen, what its actions left in the background ran on cores
        granted to other actions); what was done, in words."""
        try:
            self.client.api.kill(container.handle.container_id)
        except Exception as exc:  # noqa: BLE001 - the engine's errors, a lost connection
            log.warning("could not stop %s: %s", container.handle.short_id, exc)
            return f"it could not be stopped either ({exc})"
        return "it was stopped"

    @staticmethod
    def late(traj_id: str, aid: str, plan: ActionPlan, t0: float) -> ActionOutcome:
        """The outcome of an action whose deadline passed while it waited for its
        trajectory's previous action (the caller's lock): ``timeout``, unrun, no cores."""
        times = {"queue_s": time.perf_counter() - t0}
        return _outcome(traj_id, aid, plan, t0, times, judge.late(times["queue_s"]), ())

    def _probe(self, container: Container, probe: judge.Probe | None) -> str | None:
        """Why the container died, when the judge asked to look and it did; None too when the
        engine could not be asked (its error came out of run_action instead of the outcome)."""
        if probe is None:
            return None
        try:
            return self.lifecycle.mark_dead(container, probe.suspect)
        except Exception as exc:  # noqa: BLE001 - the engine's errors (docker's APIError, ...)
            log.warning("could not look at %s: %s", container.handle.short_id, exc)
            return None

    def _unrun(self, container: Container, failure: judge.Unrun) -> judge.Verdict:
        """The verdict on a command that never ran, the container looked at if the rule asks."""
        return judge.unrun(failure, self._probe(container, judge.UNRUN[failure.reason].probe))

    def _granted_run(
        self,
        container: Container,
        running: RunningGrant,
        request: ActionRequest,
        times: dict[str, float],
        kills: list[KillReport],
        on_grant: OnGrant | None,
    ) -> RawResult | judge.Verdict:
        """Grant, then run: what the transport saw, or the verdict on why the command could not
        run (judged here, the cores still held, as the container is looked at). What a kill
        did is appended to ``kills``."""
        t_grant = time.perf_counter()
        try:
            if running.pool is not None:
                container.control.grant_weighted(running.pool, running.quota)
            else:
                container.control.grant(running.cores, running.quota)
        except CgroupGone:
            return self._unrun(container, judge.Unrun("cgroup_vanished"))
        except (AoeError, OSError) as exc:  # OSError: a cgroup file's open (its write: AoeError)
            return self._unrun(container, judge.Unrun("grant_failed", str(exc)))
        finally:
            times["grant_s"] = time.perf_counter() - t_grant
        if on_grant is not None:
            try:
                on_grant(running)
            except Exception:  # the caller's hook must not lose the action
                log.exception("the on_grant hook of %s raised; the action runs", running.action_id)
        t_exec = time.perf_counter()
        aid = request.action_id
        try:
            return container.transport.run(
                request, lambda why: kills.append(kill_action(container, aid, why))
            )
        except Exception as exc:  # noqa: BLE001 - engine errors become the action's error
            container.transport.close()
            failure = judge.Unrun("transport_failed", f"{type(exc).__name__}: {exc}")
            return self._unrun(container, failure)
        finally:
            times["exec_s"] = time.perf_counter() - t_exec

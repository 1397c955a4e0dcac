"""Killing one action and nothing else: its processes are kept in a cgroup of their own.

The process that starts an action lives in the container's *action cgroup*, a child of the
container's cgroup made for this purpose: the runner shell is moved there once, idle on its
stdin, before its first action, and stays; an exec's launcher is moved there before its
command, blocked on its stdin. Every process the action starts is born there and cannot leave
it (the sandbox cannot write cgroup files), whatever it does: ``setsid``, a double fork, a
cleared environment. The kill freezes that cgroup (so nothing forks while it is emptied),
SIGKILLs every process in it except the runner, thaws it, and counts what is left. When the
action ends, what it left running (background processes, which survive an action that ended by
design) is moved back to the container's cgroup, so a later action's kill never takes it; what
a kill could not kill (or everything left, when the kill failed) stays in the action cgroup
instead, where every later kill takes it and each action's end signals it again.

Moves are few on purpose: writing ``cgroup.procs`` waits for an RCU grace period when none was
waited for lately (4 to 20 ms here between one-second actions), so the runner is moved once,
not in and out at every action, and survivors only when there are some.

Without access to the container's cgroups (a remote engine, a manager that is not root) the
fallback finds the action's processes as before, by ``TANGRAM_ACTION_ID=<id>`` in their
environment (the caller cannot set that variable, ``environment`` reserves it); a process that
clears its environment escapes that kill, and the action's outcome says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tangram.exec.aoe.cgroups import (
    FREEZER_DIR,
    FREEZERS,
    CgroupGone,
    Freezer,
    container_cgroup_dirs,
)
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.records import KillReport

if TYPE_CHECKING:
    from tangram.exec.aoe.lifecycle import Container

log = logging.getLogger(__name__)

#: Environment variable that marks every process of an action (the fallback kill's key).
ACTION_ENV = "TANGRAM_ACTION_ID"
#: The action cgroup's name below the container's cgroup.
GROUP_NAME = "tangram-action"
#: Where the marker fallback's tickets are taken, ``<prefix><hex>`` (``MarkerGroup``): in the
#: container's /tmp (a tmpfs of mode 1777 in every sandbox, which no action can remove; its
#: own subdirectory could be, and every later action would then be refused).
TICKET_PREFIX = "/tmp/.tangram-ticket-"
#: How long a kill waits for the cgroup to be frozen, and then for the killed to be gone.
FREEZE_WAIT_S = 0.5
GONE_WAIT_S = 1.0
#: Freeze-and-kill rounds before the kill reports survivors (one is enough unless a process
#: sits in the kernel and the freezing never completes).
KILL_ROUNDS = 3
#: Thaw writes tried before the action cgroup is taken for stuck frozen (``ActionGroup.stuck``).
THAW_TRIES = 3


class ActionGroup(ABC):
    """Where one action's processes are kept so a kill takes all of them and nothing else."""

    #: Whether ``enter`` needs the launcher's host pid (the transport looks it up if so).
    places: bool = False
    #: How its kill finds the action's processes (``KillReport.by``).
    by: Literal["cgroup", "marker"] = "marker"
    #: Why the group stays frozen (its thaw was refused, ``THAW_TRIES`` times), None when it
    #: is not: an action started in it would hang until its time-out.
    stuck: str | None = None
    #: The current action's ticket, sent with it (``transport.frame``): ``-``, none (the
    #: cgroup's kill takes the launcher before it can start an action), or the name the
    #: action's shell must take before its command runs (``MarkerGroup``).
    ticket: str = "-"

    @abstractmethod
    def enter(self, action_id: str, pid: int | None, *, launcher_stays: bool) -> None:
        """The action ``action_id`` is about to start from process ``pid``, which is idle: put
        it in the group. ``launcher_stays``: the launcher is the runner, which a kill spares
        (an exec's launcher *is* the action)."""

    @abstractmethod
    def leave(self) -> None:
        """The action ended: what it left running back with the container's processes
        (background processes survive an action that ended); the runner stays."""

    @abstractmethod
    def kill(self) -> KillReport:
        """SIGKILL every process of the current action, keep everything else."""

    @abstractmethod
    def drop_launcher(self) -> None:
        """The next ``kill`` takes the launcher (the runner) too, before it can start what it
        was sent: an action whose call was interrupted before the runner started it was
        started after the kill, which had found nothing of it."""

    @abstractmethod
    def close(self) -> None:
        """The container is going: remove what the group made."""

    def ended(self) -> None:  # noqa: B027 - optional, no-op by default
        """The current action's end was seen (its launcher is done with its line, ticket
        taken or found revoked): called before ``leave``. No-op by default."""


class CgroupGroup(ActionGroup):
    """The action cgroup: a child of the container's freezer (v1) or unified (v2) cgroup."""

    places = True
    by = "cgroup"

    def __init__(self, parent: Path, freezer: Freezer) -> None:
        self.parent = parent
        self.dir = parent / GROUP_NAME
        self.freezer = freezer
        #: The runner, which lives in the group between actions (moved in once).
        self._resident: int | None = None
        #: The process the current action's kill spares (the runner), if any.
        self._spare: int | None = None
        #: Processes a kill left alive (stuck in the kernel, or not ours to signal): they stay
        #: in the group, where every later kill takes them, and each ``leave`` signals them
        #: again; moved to the container's cgroup, nothing would reach them any more.
        self._kept: set[int] = set()
        #: A kill began and has not reported: what it left is unknown, so all of it is kept.
        self._killing = False
        try:
            self.dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise AoeError(f"cannot make the action cgroup {self.dir}: {exc}") from exc

    def _procs(self) -> set[int]:
        try:
            return {int(p) for p in (self.dir / "cgroup.procs").read_text().split()}
        except FileNotFoundError as exc:
            raise CgroupGone(f"{self.dir} is gone (container stopped?)") from exc

    def _move(self, pid: int, to: Path) -> None:
        try:
            (to / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass  # it ended meanwhile
        except FileNotFoundError as exc:
            raise CgroupGone(f"{to} is gone (container stopped?)") from exc

    def enter(self, action_id: str, pid: int | None, *, launcher_stays: bool) -> None:
        if pid is None:
            raise AoeError("the action cgroup needs the launcher's pid")
        if self.stuck is not None:
            self._try_thaw()  # once more: an action must never start in a frozen group
            if self.stuck is not None:
                raise AoeError(self.stuck)
        if not launcher_stays:
            self._move_in(pid)
            self._spare = None
            return
        # A new runner: in once, for good. Known by its pid and its presence here, not the
        # pid alone: a fresh runner given the old one's pid was never moved in, and its
        # actions were born where no kill looked. (A read of cgroup.procs; no RCU wait.)
        if pid != self._resident or pid not in self._procs():
            self._move_in(pid)
            self._resident = pid
        self._spare = pid

    def _move_in(self, pid: int) -> None:
        """Move launcher ``pid`` into the group, only if it is one of the container's (in its
        own cgroup, where the engine starts an exec): a launcher that died meanwhile (an
        earlier action's process may signal it) may have its pid reused by another
        container's or the host's process, which was moved into this container's cgroup,
        frozen at its park and killed at its time-out. ``AoeError`` when it is not."""
        try:
            ours = pid in {int(p) for p in (self.parent / "cgroup.procs").read_text().split()}
        except FileNotFoundError as exc:
            raise CgroupGone(f"{self.parent} is gone (container stopped?)") from exc
        if not ours:
            raise AoeError(
                f"the launcher's process {pid} is not the container's (it ended before its "
                "action was sent?); nothing was run"
            )
        self._move(pid, self.dir)

    def leave(self) -> None:
        """Called in the transport's ``finally`` after every action: an error other than the
        cgroup being gone is logged, never raised (it replaced the action's result with a
        "container failure"); what could not be moved stays in the group, where the next
        action's kill may take it."""
        self._spare = None
        try:
            left = self._procs() - {self._resident}
            if self._killing:  # the kill raised: whatever is left may be the action's
                self._kept |= left
                self._killing = False
            self._kept &= left  # (those that died are forgotten)
            self._sigkill_members(self._kept)
            if not left - self._kept:
                return  # the usual case: nothing left running but the runner, no write
            self._move_survivors_out()
        except CgroupGone:
            pass  # the container died: nothing left to move
        except (AoeError, OSError) as exc:
            log.warning("what the action left in %s could not be moved out: %s", self.dir, exc)

    def _move_survivors_out(self) -> None:
        """Move every process but the runner back to the container's cgroup, frozen while
        moved (none forks a child in behind us) when the freezer allows; each refused move is
        logged and the rest go on."""
        frozen = self._try_freeze()
        try:
            if frozen:
                # Frozen indeed before they are read (as the kill waits): moves go by pid, and
                # one still running that exited after the read, its pid given to another
                # process (the container's init, not frozen, reaps it), had that process (a
                # host's) moved into the container's cgroup, frozen at its park.
                _wait(lambda: self.freezer.is_frozen(self.dir), FREEZE_WAIT_S)
            for pid in self._procs() - {self._resident} - self._kept:
                try:
                    self._move(pid, self.parent)
                except CgroupGone:
                    raise
                except OSError as exc:
                    log.warning("process %d could not be moved out of %s: %s", pid, self.dir, exc)
        finally:
            if frozen:
                self._try_thaw()

    def drop_launcher(self) -> None:
        """The runner is no longer spared (nor resident: a fresh one is moved in): frozen
        with the rest, it is killed wherever it is, the action it was sent unread or started
        (the action then in the group, killed with it)."""
        self._spare = None
        self._resident = None

    def kill(self) -> KillReport:
        """Freeze, SIGKILL all but the runner, thaw, in up to ``KILL_ROUNDS`` rounds; what
        is still alive at the end (or everything, when this raises) is kept in the group."""
        self._killing = True
        report = self._kill_rounds()
        self._killing = False
        return report

    def _kill_rounds(self) -> KillReport:
        """The kill's rounds; survivors are recorded in ``_kept``. Those an earlier kill
        left (kept) are signalled again but neither waited for nor counted: they are not
        this action's, and were reported with their own."""
        earlier = set(self._kept)

        def alive() -> set[int]:
            return self._procs() - {self._spare} - earlier

        victims: set[int] = set()
        for round_ in range(KILL_ROUNDS):
            frozen = self._try_freeze()
            try:
                if frozen:
                    _wait(lambda: self.freezer.is_frozen(self.dir), FREEZE_WAIT_S)
                members = self._procs()
                if (
                    round_ == 0
                    and self._spare is not None
                    and not members - {self._spare} - earlier
                ):
                    # Nothing of the action in the group (frozen: none can be forked now): the
                    # runner has not started it (slow to read it: a loaded machine), or it has
                    # ended. Spared, the runner read it after this kill and ran it, its outcome
                    # a time-out; killed with the rest, it never starts it (a fresh one is
                    # started for the next action).
                    self.drop_launcher()
                victims = members - {self._spare}
                self._sigkill_members(victims)
            finally:
                if frozen:
                    self._try_thaw()
            if not victims - earlier or _wait(lambda: not alive(), GONE_WAIT_S):
                return KillReport("cgroup", 0)
        survivors = alive()
        self._kept |= survivors
        return KillReport("cgroup", len(survivors))

    def _sigkill_members(self, pids: set[int]) -> None:
        """SIGKILL those of ``pids`` still in the group, each held by a pidfd opened before
        the group is read again and signalled through it: by pid, one listed that ended
        before its signal (a kept survivor dying at last, a process killed in an unfrozen
        round) had its pid's next holder, another container's or a host process, killed."""
        held: dict[int, int] = {}
        try:
            for pid in pids:
                fd = _hold(pid)
                if fd is not None:
                    held[pid] = fd
            if not held:
                return
            members = self._procs()  # after the opens: each fd is the listed process's
            for pid, fd in held.items():
                if pid in members:
                    _sigkill_held(fd, pid)
        finally:
            for fd in held.values():
                _release(fd)

    def _try_freeze(self) -> bool:
        """Freeze the group (for a kill or a move); False when the freezer refused (EBUSY,
        EACCES, ...): a kill then signals the processes unfrozen, round after round, rather
        than none at all. ``CgroupGone`` passes (the container, and its processes, are gone)."""
        try:
            self.freezer.freeze(self.dir)
        except CgroupGone:
            raise
        except (AoeError, OSError) as exc:
            log.warning("the action cgroup %s could not be frozen: %s", self.dir, exc)
            return False
        return True

    def _try_thaw(self) -> None:
        """Thaw after ``_try_freeze``, up to ``THAW_TRIES`` writes; a refusal is logged, not
        raised (the kill's report, and the action's outcome, must not be lost to it), and
        recorded in ``stuck``: left frozen, the group would hang the next action (the runner
        lives in it) until that action's time-out. ``CgroupGone`` passes."""
        for _ in range(THAW_TRIES):
            try:
                self.freezer.thaw(self.dir)
            except CgroupGone:
                raise
            except (AoeError, OSError) as exc:
                log.warning("the action cgroup %s could not be thawed: %s", self.dir, exc)
                self.stuck = f"the action cgroup {self.dir} stays frozen: its thaw failed: {exc}"
            else:
                self.stuck = None
                return

    def close(self) -> None:
        """Thaw the group (best effort), then remove it: runc thaws the container's cgroup
        for its kill, never this child, and v1's frozen processes do not die of SIGKILL, so a
        group left frozen made the container's removal fail."""
        with contextlib.suppress(AoeError, OSError):
            self.freezer.thaw(self.dir)
        with contextlib.suppress(OSError):
            self.dir.rmdir()


class MarkerGroup(ActionGroup):
    """The fallback without cgroup access: an action's processes are those whose environment
    carries its marker, seen from here when the engine is local, else from inside."""

    def __init__(
        self, client: Any, container_id: str, user: str, pids: Callable[[], list[int] | None]
    ) -> None:
        self.client, self.container_id, self.user, self.pids = client, container_id, user, pids
        self._action: str | None = None
        #: Whether the current action's ticket was revoked already (a second kill, "stuck"
        #: after a time-out, finds it taken by its own revocation, not by the action).
        self._revoked = False

    def enter(self, action_id: str, pid: int | None, *, launcher_stays: bool) -> None:
        # A fresh random ticket per action: an earlier action's process cannot guess it, and
        # a launcher still holding an older line checks that line's own.
        self._action, self.ticket, self._revoked = action_id, secrets.token_hex(16), False

    def leave(self) -> None:
        self._action, self.ticket, self._revoked = None, "-", False

    def close(self) -> None:
        pass  # nothing was made

    def ended(self) -> None:
        """A revocation the action's shell never came back for (it had taken its ticket, ran,
        and was killed) is removed: left, one empty directory per time-out stayed in /tmp
        for every later action to see. Its launcher is done with the line, so it is moot."""
        if self._action is not None and self._revoked:
            self._revoked = False
            _run_inside(self.client, self.container_id, self.user, ["rmdir", self._ticket_path])

    @property
    def _ticket_path(self) -> str:
        return TICKET_PREFIX + self.ticket  # (hex: no quoting needed)

    def drop_launcher(self) -> None:
        pass  # the runner cannot be told from the container's other processes (docs/aoe.md)

    def kill(self) -> KillReport:
        """Revoke the action's ticket, then kill what carries its marker. The runner (or an
        exec's launcher) cannot be told from the container's other processes, so it is
        spared, and one that had not read the action yet (held: a loaded machine) started it
        after the kill had found nothing, its outcome given. Revoked first, the ticket is
        either taken already, by the action's shell, which carries the marker, so the kill
        below finds it, or the shell will find it taken and run nothing."""
        if self._action is None:
            return KillReport("marker", None)
        if not self._revoked:
            # (A failure is logged: the action may then still start; a container gone runs
            # nothing anyway.) Said done once done: said before, an interrupt inside it (the
            # transport's abort then killing again) had the revocation skipped.
            _run_inside(self.client, self.container_id, self.user, ["mkdir", self._ticket_path])
            self._revoked = True
        if not self._kill_seen(f"{ACTION_ENV}={self._action}".encode()):
            _kill_inside(self.client, self.container_id, self.user, self._action)
        return KillReport("marker", None)

    def _kill_seen(self, marker: bytes) -> int:
        """Kill from here, in up to ``KILL_ROUNDS`` rounds (a round catches what forked while
        the one before read the environments) until one finds none; how many were killed
        (0 too when the container's processes cannot be seen from here)."""
        killed = 0
        for _ in range(KILL_ROUNDS):
            try:
                visible = self.pids() or []
            except CgroupGone:
                return killed
            found = _kill_visible(visible, marker)
            if not found:
                break
            killed += found
        return killed


def kill_action(container: Container, aid: str, why: str) -> KillReport:
    """Kill every process of action ``aid`` in ``container`` (at its time-out or on overflow),
    keep the rest; what was done, for the outcome."""
    try:
        report = container.group.kill()
    except CgroupGone:
        report = KillReport("cgroup", 0)  # the container is gone, and its processes with it
    except (AoeError, OSError) as exc:
        # Raised through the transport, this lost the action's output and made its time-out a
        # "container failure"; its processes were then moved out of the group and lived on.
        log.warning("the kill of action %s in %s failed: %s", aid, container.handle.short_id, exc)
        report = KillReport(container.group.by, None)
    if container.group.stuck is not None:
        # The runner lives in the frozen group: the next action would hang until its time-out.
        container.dead = container.dead or (
            f"container {container.handle.short_id} was left frozen by the kill of action "
            f"{aid} ({container.group.stuck})"
        )
        report = replace(report, left_frozen=True)
    log.info(
        "killed action %s in %s (%s): by %s, %s survivor(s)",
        aid,
        container.handle.short_id,
        why,
        report.by,
        "?" if report.survivors is None else report.survivors,
    )
    return report


def action_group(
    client: Any,
    container_id: str,
    init_pid: int | None,
    user: str,
    pids: Callable[[], list[int] | None],
) -> ActionGroup:
    """The action cgroup when this process can make one in the container's cgroup (the
    engine is local and we may write there), otherwise the environment-marker fallback. The
    cgroup must carry the container's id: ``init_pid`` was seen the container's a moment
    before, and an init that died in between, its pid given to another process, had the
    group made in that process's cgroup (a host service's), its launchers refused there."""
    why = "the engine's processes are not visible here"
    if init_pid is not None:
        try:
            version, dirs = container_cgroup_dirs(init_pid, container_id)
            parent = dirs.get(FREEZER_DIR[version])
            if parent is None:
                raise AoeError("no freezer cgroup for the container")
            return CgroupGroup(parent, FREEZERS[version])
        except AoeError as exc:
            why = str(exc)
    log.warning(
        "AOE kills the actions of container %s by their environment marker (%s): a process "
        "that clears its environment can survive a time-out",
        container_id[:12],
        why,
    )
    return MarkerGroup(client, container_id, user, pids)


def _wait(done: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``done`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.0005
    while True:
        with contextlib.suppress(CgroupGone):
            if done():
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


#: The pidfd calls, apart so the fake cgroup trees' tests can stand in for them.
_pidfd_open = os.pidfd_open
_pidfd_send_signal = signal.pidfd_send_signal
_close_fd = os.close


def _hold(pid: int) -> int | None:
    """A pidfd for the process that has pid ``pid`` now (a signal through it reaches that
    process or none, never a later holder of the pid: the pid itself may still be reused, so
    the caller checks the process is the one it listed after the open), or None when it is
    gone or cannot be held (logged: it is then left to the survivors' count)."""
    try:
        return _pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError as exc:
        log.warning("could not hold process %d to kill it: %s", pid, exc)
        return None


def _release(fd: int) -> None:
    with contextlib.suppress(OSError):
        _close_fd(fd)


def _sigkill_held(fd: int, pid: int) -> None:
    """SIGKILL the process pidfd ``fd`` holds (pid ``pid``); one already gone is fine, one
    that may not be signalled (EPERM) is logged and left to the survivors' count."""
    try:
        _pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except OSError as exc:
        log.warning("could not SIGKILL process %d: %s", pid, exc)


def _kill_visible(pids: list[int], marker: bytes) -> int:
    """SIGKILL the host processes among ``pids`` whose environment holds ``marker``; how many.

    Each is held by a pidfd before its environment is read, and signalled through it: by pid,
    a process that ended after the read had its pid's next holder (another container's or a
    host process) killed. All are stopped (SIGSTOP) before any is killed: killed one by one,
    a shell whose command died first went on with its script (a write, a new command) before
    its own signal came."""
    held: list[int] = []
    try:
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            held.append(pidfd)
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                environ = []
            if marker not in environ:
                os.close(held.pop())
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pidfd in held:
                try:
                    signal.pidfd_send_signal(pidfd, sig)
                except ProcessLookupError:
                    pass
                except OSError as exc:  # (each one tried: raised, the rest stayed stopped)
                    log.warning("could not signal a process of the action: %s", exc)
        return len(held)
    finally:
        for pidfd in held:
            os.close(pidfd)


def _run_inside(client: Any, container_id: str, user: str, command: list[str]) -> None:
    """Run ``command`` in the container as the sandbox user (a ticket's revocation and its
    removal: /tmp is sticky, and the action's shell removes a revocation it finds), waiting
    for its end; an engine's error is logged."""
    try:
        exec_id = client.api.exec_create(container_id, command, user=user)["Id"]
        client.api.exec_start(exec_id)
    except Exception as exc:  # noqa: BLE001 - the engine's errors, a lost connection
        log.warning("%s in %s failed: %s", " ".join(command), container_id[:12], exc)


def _kill_inside(client: Any, container_id: str, user: str, aid: str) -> None:
    """Fallback when the container's processes are not visible from here: kill from inside.
    ``aid`` is held to ``execution.ACTION_ID`` (no quotes, no spaces) and matched as a fixed
    string."""
    # All found are stopped before any is killed (one by one, a shell whose command died
    # first went on with its script before its own signal came), in rounds until one finds
    # none (a round catches what forked while the one before read the environments).
    script = (
        f"for r in {' '.join(str(r) for r in range(KILL_ROUNDS))}; do s=; "
        "for p in /proc/[0-9]*; do "
        f"tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qxF '{ACTION_ENV}={aid}' && "
        's="$s ${p#/proc/}"; done; '
        '[ -n "$s" ] || break; kill -STOP $s 2>/dev/null; kill -9 $s 2>/dev/null; done'
    )
    with contextlib.suppress(Exception):
        client.api.exec_start(
            client.api.exec_create(container_id, ["/bin/sh", "-c", script], user=user)["Id"]
        )

"""Running one action's command in a container and collecting what it prints.

Two transports, one contract (``run(request, kill) -> RawResult``):

- ``ExecTransport``: one ``docker exec`` per action. Simple; tens of milliseconds per action,
  and an action that leaves a background process holding its stdout ends only when that
  process closes it (docker's own semantics).
- ``RunnerTransport``: one long-lived ``/bin/sh`` loop per container, started once with
  ``docker exec -i``; each action is sent on its stdin and comes back as its output followed
  by a random end marker carrying the exit code. About a millisecond per action, and an action
  ends when its own shell exits.

Both send the action the same way (``frame``): one line ``[TOKEN] TICKET ACTION_ID ARG``
(TICKET: ``-``, or the ticket the marker fallback's action shell takes before it runs, see
``tangram_ticket``), where ARG
is the base64 of a short script, or ``@N`` followed by the N raw bytes of a long one, which
the container's shell reads (``head -c``) into its memory and hands to the action's
``/bin/sh`` as its arguments (``_START``): a script passed as one argument is limited by the
kernel to 128 KiB, reading a megabyte with ``read`` would take a second, and a file or a pipe
would be the actions' to reach (same uid: a FIFO left at a spool file's name served a later
action a forged script). Before the line is sent, the shell that will start the action is
idle on its stdin and is put in the action cgroup (``kill.ActionGroup``), so whatever the
action starts is born there.

Both read docker's multiplexed stream (8-byte frame headers) with a deadline, enforce the
output size limit while reading, and call ``kill`` at the time-out or on overflow; the kill
takes the action cgroup's processes (the runner spared) and keeps the container and the
processes of earlier actions.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import secrets
import socket
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tangram.exec.aoe.environment import KEY, exports
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.kill import TICKET_PREFIX, ActionGroup

log = logging.getLogger(__name__)

#: Scripts up to this size travel inline (base64 on the protocol line); longer ones as raw
#: bytes after their length. Well under the kernel's 128 KiB limit on one argument, and where
#: reading the line byte by byte (as ``read`` does on a pipe) still costs milliseconds.
INLINE_MAX_BYTES = 16 << 10

#: Shell function both transports use to turn ARG into ``$script`` (``$n``: a long script's
#: byte count, else empty). A long one (ARG ``@N:TRAILER``) is N bytes then the random
#: TRAILER, read off stdin by one ``head -c`` into the shell's memory and run only when it
#: ends with the trailer: a send that failed part-way left ``head`` the bytes sent before
#: the close, which it returned with success, and the truncated script ran after its action
#: had ended with an error. Never into a file: any file the runner can write, the actions (the same
#: uid) can open too, or replace with a FIFO they serve (an earlier action's process served a
#: later long action a forged script that way). One reader: several ``head -c`` in turn lose
#: the bytes one reads ahead (stdio) when the pipe holds more. Fails (status 2) only when the
#: bytes could not be taken off stdin (a fork refused at the pids limit): the stream is then
#: out of step, and the caller must stop reading it.
#:
#: ``tangram_ticket TICKET`` (``-``: none) puts the action's ticket check in front of
#: ``$script`` (on its first line: the script's line numbers stay): the action's own shell,
#: already carrying the action's marker, takes the ticket (``mkdir``, atomic) before anything
#: of the command runs, and finds it taken when the manager revoked the action first
#: (``kill.MarkerGroup``): it then runs nothing (status 125). The ticket is let go at once
#: (``rmdir``), so no file of it is left for the action to see.
_LOAD = r"""
substr=
( x=ab; [ "${x:1:1}" = b ] ) 2>/dev/null && substr=1
tangram_load() {
  n=
  case $1 in
  @*:*)
    n=${1#@}; trailer=${n#*:}; n=${n%%:*}
    if ! script=$(head -c "$((n + ${#trailer}))"); then
      echo "tangram runner: could not receive the command (pids limit reached?)" >&2
      return 2
    fi
    case $script in
    *"$trailer") script=${script%"$trailer"} ;;
    *) echo "tangram runner: the command arrived cut short; not run" >&2; return 2 ;;
    esac ;;
  *)
    script=$(printf '%s' "$1" | base64 -d 2>/dev/null) || script='echo "tangram runner: could not decode the action (fork failed: pids limit reached?)" >&2; exit 125' ;;
  esac
}
tangram_ticket() {
  [ "$1" = - ] && return 0
  t="@TICKET@$1"
  t="mkdir $t 2>/dev/null || { [ -d $t ] && rmdir $t 2>/dev/null; echo 'tangram runner: the action was revoked (timed out or interrupted) before it started, or its ticket could not be taken (pids limit reached?); not run' >&2; exit 125; }; rmdir $t 2>/dev/null; "
  script=$t$script
  [ -z "$n" ] || n=$((n + ${#t}))
  return 0
}
""".replace("@TICKET@", TICKET_PREFIX)

#: The most a runner's ``drain`` discards before an action (what background processes of
#: earlier actions printed between actions): one printing faster than it is read would keep
#: it reading for ever, the action never sent. The rest is read with the action's output.
DRAIN_MAX_BYTES = 8 << 20

#: Scripts up to this many bytes start as one argument (``sh -c SCRIPT``: the kernel limits
#: one to 128 KiB). A longer one starts as several arguments of at most ``CHUNK_CHARS``
#: characters (4 bytes each at most), which its shell joins and evals (``_JOIN``). The loop
#: runs to ``$n``, the byte count: busybox ash's ``${#script}`` counts UTF-8 characters
#: under LANG=C.UTF-8 while ``${script:o:l}`` counts bytes, and a bound of ``${#script}``
#: dropped the tail of a non-ASCII script (a grader's ``exit 1`` came back as exit 0). Never
#: through a pipe or a file, since the action's own ``/bin/sh`` is an ordinary process of the
#: actions' uid, whose stdin a process an earlier action left can open (``/proc/PID/fd/0``),
#: pause the reader, kill the writer and write a script of its own, whose output and exit
#: status the runner then reports as the action's (stop 27's review forged a 900 KB grader's
#: exit 1 into exit 0 that way). Either way the script runs in the image's ``/bin/sh`` as a
#: short one does, not in the runner's shell (busybox's ``echo``, ``grep`` or ``ls`` there).
ARGUMENT_MAX_BYTES = 100_000
CHUNK_CHARS = 32_000

#: The joined arguments, IFS back to the shell's, the positional parameters cleared, the
#: script evaluated (``sh -c JOIN /bin/sh PIECE...``; no variable left behind).
_JOIN = 'd=$IFS; IFS=; set -- "$*"; IFS=$d; unset d; eval "set --; $1"'

#: How the action's shell starts, in the subshell that exported its id (``$script``, ``$n``).
#: Splitting needs ``${var:offset:length}`` (busybox ash: the guarded runner; not dash): a
#: runner without it (not root, or no static busybox on the host: its own memory is then
#: open to the actions anyway, docs/aoe.md) pipes a long script to its shell instead.
_START = (
    f'[ "${{n:-0}}" -le {ARGUMENT_MAX_BYTES} ] && exec /bin/sh -c "$script"; '
    'if [ -n "$substr" ]; then set --; o=0; while [ "$o" -lt "$n" ]; do '
    f'set -- "$@" "${{script:$o:{CHUNK_CHARS}}}"; o=$((o + {CHUNK_CHARS})); done; '
    f"exec /bin/sh -c '{_JOIN}' /bin/sh \"$@\"; fi; "
    """printf '%s' "$script" | exec /bin/sh -c 'eval "$(cat)" </dev/null' /bin/sh"""
)

#: The persistent runner: read "TOKEN TICKET ACTION_ID ARG" lines; run each script in a fresh
#: /bin/sh with the action id exported, stdin from /dev/null; then print the end markers.
#: Each action writes to its own opening of the runner's stdout and stderr pipes (reopened
#: through /proc/self/fd when that works): the flags an action sets on them (O_NONBLOCK, as
#: Node does) stay with its own open file description, never the runner's, where they would
#: make a later action's writes fail (a truncated output, a program dying on EAGAIN).
#: POSIX sh: runs under busybox ash and dash alike.
RUNNER_SCRIPT = (
    _LOAD
    + r"""
reopen=
( : >/proc/self/fd/1 && : 2>/proc/self/fd/2 ) 2>/dev/null && reopen=1
while IFS=' ' read -r tok ticket aid arg; do
  tangram_load "$arg" || exit 125
  tangram_ticket "$ticket"
  if [ -n "$reopen" ]; then
    ( export TANGRAM_ACTION_ID="$aid"; """
    + _START
    + r""" ) </dev/null >/proc/self/fd/1 2>/proc/self/fd/2
  else
    ( export TANGRAM_ACTION_ID="$aid"; """
    + _START
    + r""" ) </dev/null
  fi
  rc=$?
  printf '
%s %s
' "$tok" "$rc"
  printf '
%s
' "$tok" >&2
done
"""
)

#: One exec's launcher: wait for its "TICKET ACTION_ID ARG" line (idle, so it can be put in the
#: action cgroup first), then become the action's shell.
EXEC_SCRIPT = (
    _LOAD
    + r"""
IFS=' ' read -r ticket aid arg || exit 125
tangram_load "$arg" || exit 125
tangram_ticket "$ticket"
export TANGRAM_ACTION_ID="$aid"
exec </dev/null
"""
    + _START
    + "\n"
)


@dataclass(frozen=True)
class ActionRequest:
    """What a transport runs: a shell script, its environment, its limits."""

    action_id: str
    script: str
    env: Mapping[str, str]
    timeout_s: float
    max_output_bytes: int


@dataclass(frozen=True)
class RawResult:
    """What a transport saw, before the manager turns it into an ``ActionOutcome``.

    ``ended`` is how the stream ended: ``exit`` (normal), ``timeout`` (killed at the
    deadline), ``overflow`` (killed for printing too much), ``eof`` (the stream closed before
    the action's end: the container or the runner died), ``stuck`` (killed, yet no end came
    within the grace period).
    """

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    ended: str
    stdout_bytes: int
    stderr_bytes: int


class Attached:
    """An exec's attach socket, kept together with the docker SDK object that owns it.

    ``exec_start(socket=True)`` returns a ``SocketIO`` that sits in a reference cycle with its
    HTTP response (the SDK pins the response on it). Dropped, the cycle collector frees it at
    some later moment and its close shuts the socket under whoever still reads it: an action
    then failed with ``OSError: [Errno 9] Bad file descriptor`` (CI, 100 actions at once).
    Holding the owner for as long as the socket is used, and closing both, keeps the fd ours.
    """

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.sock: socket.socket = getattr(owner, "_sock", owner)

    def close(self) -> None:
        """Close the socket and its owner (each close is idempotent; errors are moot here)."""
        for closeable in (self.sock, self.owner):
            with contextlib.suppress(OSError):
                closeable.close()


def shell_script(env: Mapping[str, str], command: str) -> str:
    """A /bin/sh script exporting ``env`` then running ``command``. Values are quoted; a name
    cannot be (``export`` takes a bare name), so one that is not a shell variable name is
    refused here, whatever the callers checked."""
    for key in env:
        if not isinstance(key, str) or not KEY.match(key):
            raise AoeError(f"env key {key!r} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return exports(env) + command


def frame(prefix: str, req: ActionRequest) -> bytes:
    """The bytes that hand ``req`` to a waiting launcher: ``PREFIX ARG`` then, for a long
    script, its raw bytes and a random trailer that says they all arrived (``_LOAD``)."""
    script = shell_script(req.env, req.script).encode()
    if len(script) <= INLINE_MAX_BYTES:
        return f"{prefix} {base64.b64encode(script).decode()}\n".encode()
    trailer = secrets.token_hex(8)
    return f"{prefix} @{len(script)}:{trailer}\n".encode() + script + trailer.encode()


def send(sock: socket.socket, data: bytes, timeout_s: float) -> None:
    """Write all of ``data``, blocking up to ``timeout_s`` in all (the reader leaves the socket
    non-blocking; a megabyte does not fit in its buffer at once)."""
    sock.settimeout(max(timeout_s, 0.001))
    try:
        sock.sendall(data)
    except OSError as exc:
        raise AoeError(f"could not send the action ({len(data)} bytes): {exc}") from exc


def launcher_pid(api: Any, exec_id: str, timeout_s: float = 10.0) -> int:
    """The host pid of an exec's process, once the engine has started it."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = api.exec_inspect(exec_id)
        if info.get("Pid"):
            return int(info["Pid"])
        if time.monotonic() >= deadline or (
            info.get("ExitCode") is not None and not info.get("Running")
        ):
            raise AoeError(f"the exec's shell did not start (exit code {info.get('ExitCode')})")
        time.sleep(0.001)


#: The least an exec's exit code is waited for after its stream closed (the action's
#: remaining time when that is longer): the engine records it a moment later, more than a
#: second later on a loaded machine.
EXIT_CODE_WAIT_S = 1.0


def exit_code(api: Any, exec_id: str, until: float) -> int | None:
    """The exit code of the exec ``exec_id`` once the engine has recorded it, looked for until
    ``until`` (``time.monotonic``), None when it was not by then. The looks slow down to one
    per 50 ms: a fixed count of 5 ms looks gave up after about a second, and a loaded
    machine's command that had succeeded came back with its exit code unknown."""
    delay = 0.001
    while True:
        info = api.exec_inspect(exec_id)
        if not info.get("Running"):
            return info.get("ExitCode")
        if time.monotonic() >= until:
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


class FrameReader:
    """Demultiplexes docker's non-TTY attach stream: (stream 1|2, payload) frames."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.eof = False

    def _fill(self, timeout: float | None) -> bool:
        """Receive more bytes; False on time-out. Sets ``eof`` when the peer closes."""
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(1 << 16)
        except (TimeoutError, BlockingIOError):
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def _parse(self) -> tuple[int, bytes] | None:
        if len(self.buf) < 8:
            return None
        stream, size = self.buf[0], struct.unpack(">I", self.buf[4:8])[0]
        if len(self.buf) < 8 + size:
            return None
        payload = bytes(self.buf[8 : 8 + size])
        del self.buf[: 8 + size]
        return stream, payload

    def next_frame(self, timeout: float | None) -> tuple[int, bytes] | None:
        """The next frame, or None when ``timeout`` passes or the stream ended (see ``eof``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            frame = self._parse()
            if frame is not None or self.eof:
                return frame
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._fill(left) and not self.eof:
                return None

    def drain(self) -> int:
        """Discard whatever is already waiting (output of background processes), at most
        about ``DRAIN_MAX_BYTES``; bytes dropped."""
        dropped = 0
        while dropped < DRAIN_MAX_BYTES:
            frame = self.next_frame(0.0)
            if frame is None:
                break
            dropped += len(frame[1])
        return dropped


class Capture:
    """One stream's output: the first ``limit`` bytes kept, the total counted, and (for the
    runner) the end marker found. Memory stays bounded whatever the command prints."""

    def __init__(self, limit: int, marker: bytes | None, with_code: bool) -> None:
        self.limit = limit
        self.marker = marker
        self.with_code = with_code
        self.buf = bytearray()
        self.total = 0
        self.done = False
        self.code: int | None = None
        self._tail = 0 if marker is None else len(marker) + 16

    def feed(self, data: bytes) -> None:
        if self.done:
            return
        start = max(0, len(self.buf) - self._tail)
        self.buf += data
        self.total += len(data)
        if self.marker is not None:
            pos = self.buf.find(self.marker, start)
            if pos >= 0:
                end = self.buf.find(b"\n", pos + len(self.marker))
                if end >= 0:
                    if self.with_code:
                        with contextlib.suppress(ValueError):
                            self.code = int(self.buf[pos + len(self.marker) : end])
                    self.total -= len(self.buf) - pos
                    del self.buf[pos:]
                    self.done = True
                    return
                start = pos  # marker seen, its line not complete yet
        cap = self.limit + self._tail
        if len(self.buf) > cap:  # keep the head we return and a tail to find the marker in
            keep_tail = self.buf[len(self.buf) - self._tail :] if self._tail else b""
            del self.buf[self.limit :]
            self.buf += keep_tail

    @property
    def overflow(self) -> bool:
        """Certainly more than ``limit`` bytes (the marker's own bytes allowed for)."""
        return self.total > self.limit + self._tail or (self.done and self.total > self.limit)

    def content(self) -> bytes:
        return bytes(self.buf[: self.limit])


def collect(
    reader: FrameReader,
    out: Capture,
    err: Capture,
    deadline: float,
    grace_s: float,
    kill: Callable[[str], None],
    finished: Callable[[], bool],
) -> str:
    """Read frames into ``out``/``err`` until ``finished()``; kill at the deadline or on
    overflow. Returns how it ended: exit, timeout, overflow, eof or stuck."""
    killed: str | None = None
    give_up = float("inf")
    while not finished():
        now = time.monotonic()
        if killed is None and now >= deadline:
            # The grace counts from the kill's return: counted from before it, a kill that
            # took longer (the marker fallback's engine calls) had a prompt end "stuck".
            killed = "timeout"
            kill("timeout")
            give_up = time.monotonic() + grace_s
            continue
        if killed is not None and now >= give_up:
            return "stuck"
        frame = reader.next_frame(min(deadline if killed is None else give_up, now + 1.0) - now)
        if frame is None:
            if reader.eof:
                return killed or "eof"
            continue
        stream, payload = frame
        (err if stream == 2 else out).feed(payload)
        if killed is None and (out.overflow or err.overflow):
            killed = "overflow"
            kill("overflow")
            give_up = time.monotonic() + grace_s
    return killed or "exit"


def _abort(group: ActionGroup, kill: Callable[[str], None], exc: BaseException) -> None:
    """Kill an action whose send or collect raised (an interrupt, a KeyboardInterrupt, in the
    caller's thread; a failed send), launcher included (``ActionGroup.drop_launcher``): left
    running, the action went on past its time-out (moved out of the action cgroup by
    ``leave``, where no later kill took it), and a runner still busy with it gave its output
    and end marker to the next action as that one's stdout. The runner must die with it:
    spared, one that had not yet read the action it was sent (the interrupt landing right
    after the send) started it after the kill, which had found nothing, and the caller had
    already been told it was interrupted."""
    group.drop_launcher()
    kill("interrupted" if not isinstance(exc, Exception) else "send failed")


class ExecTransport:
    """One ``docker exec`` per action."""

    name = "exec"

    def __init__(
        self,
        api: Any,
        container_id: str,
        user: str,
        workdir: str,
        grace_s: float,
        group: ActionGroup,
    ) -> None:
        self.api, self.container_id = api, container_id
        self.user, self.workdir, self.grace_s = user, workdir, grace_s
        self.group = group
        #: The launcher's shell (``guarded.shell_command()`` for an exec-only one: a launcher
        #: from the image's /bin/sh is dumpable, and a process an earlier action left wrote a
        #: forged action line into its stdin through /proc/PID/fd/0 before the real one).
        self.shell: tuple[str, ...] = ("/bin/sh",)

    def run(self, req: ActionRequest, kill: Callable[[str], None]) -> RawResult:
        exec_id = self.api.exec_create(
            self.container_id,
            [*self.shell, "-c", EXEC_SCRIPT],
            stdin=True,
            stdout=True,
            stderr=True,
            user=self.user,
            workdir=self.workdir,
        )["Id"]
        attached = Attached(self.api.exec_start(exec_id, socket=True))
        raw = attached.sock
        out = Capture(req.max_output_bytes, None, False)
        err = Capture(req.max_output_bytes, None, False)
        reader = FrameReader(raw)
        try:
            pid = launcher_pid(self.api, exec_id) if self.group.places else None
            self.group.enter(req.action_id, pid, launcher_stays=False)
            # From the send on, as the runner's: the launcher's start (the engine's, seconds on
            # a loaded machine) is not the command's time.
            deadline = time.monotonic() + req.timeout_s
            try:
                send(raw, frame(f"{self.group.ticket} {req.action_id}", req), req.timeout_s)
                ended = collect(reader, out, err, deadline, self.grace_s, kill, lambda: reader.eof)
            except BaseException as exc:  # the launcher may hold the line: killed with the rest
                _abort(self.group, kill, exc)
                raise
            if ended != "stuck":
                self.group.ended()  # the stream closed: the launcher is done with its line
        finally:
            attached.close()
            self.group.leave()
        code = None
        if ended != "stuck":
            # The command ended (its stream closed): its exit code is the engine's to record,
            # looked for while the action has time left and, past that, for the kill's grace
            # at least (a second was too little for a loaded engine: exit_unknown).
            wait_s = max(EXIT_CODE_WAIT_S, self.grace_s)
            try:
                code = exit_code(self.api, exec_id, max(deadline, time.monotonic() + wait_s))
            except Exception as exc:  # noqa: BLE001 - the engine's errors, a lost connection
                # The command ran: raised, its output was lost to a transport failure.
                log.warning("the exit code of action %s could not be read: %s", req.action_id, exc)
        if ended == "eof":
            ended = "exit"  # for a per-action exec the stream's end is the action's end
        return RawResult(code, out.content(), err.content(), ended, out.total, err.total)

    def close(self) -> None:
        pass


class RunnerTransport:
    """A persistent shell per container that runs each action sent on its stdin."""

    name = "runner"

    def __init__(
        self,
        api: Any,
        container_id: str,
        user: str,
        workdir: str,
        grace_s: float,
        group: ActionGroup,
    ) -> None:
        self.api, self.container_id = api, container_id
        self.user, self.workdir, self.grace_s = user, workdir, grace_s
        self.group = group
        #: The shell the runner runs in (``guarded.shell_command()`` for an exec-only one).
        self.shell: tuple[str, ...] = ("/bin/sh",)
        self._attached: Attached | None = None
        self._sock: socket.socket | None = None
        self._reader: FrameReader | None = None
        self.exec_id: str | None = None
        #: The runner's host pid, when the action group needs it.
        self.pid: int | None = None

    def start(self) -> None:
        self.close()
        self.exec_id = self.api.exec_create(
            self.container_id,
            [*self.shell, "-c", RUNNER_SCRIPT],
            stdin=True,
            stdout=True,
            stderr=True,
            user=self.user,
            workdir=self.workdir,
        )["Id"]
        self._attached = Attached(self.api.exec_start(self.exec_id, socket=True))
        self._sock = self._attached.sock
        self._reader = FrameReader(self._sock)
        self.pid = launcher_pid(self.api, self.exec_id) if self.group.places else None

    def alive(self) -> bool:
        return self._reader is not None and not self._reader.eof

    def run(self, req: ActionRequest, kill: Callable[[str], None]) -> RawResult:
        if not self.alive():
            self.start()
        assert self._reader is not None and self._sock is not None
        dropped = self._reader.drain()
        if dropped:
            log.debug(
                "runner %s: dropped %d bytes printed between actions",
                self.container_id[:12],
                dropped,
            )
        if self._reader.eof:
            self.start()
            assert self._reader is not None and self._sock is not None
        token = "@@tangram-end-" + secrets.token_hex(12)
        out = Capture(req.max_output_bytes, b"\n" + token.encode() + b" ", True)
        err = Capture(req.max_output_bytes, b"\n" + token.encode(), False)
        reader = self._reader
        # The send counts in the time-out: taken after it, a send that took most of the
        # time-out left the command its whole time-out on top, past the caller's deadline.
        deadline = time.monotonic() + req.timeout_s
        try:
            self.group.enter(req.action_id, self.pid, launcher_stays=True)
            data = frame(f"{token} {self.group.ticket} {req.action_id}", req)  # (after enter)
            try:
                send(self._sock, data, deadline - time.monotonic())
                ended = collect(
                    reader, out, err, deadline, self.grace_s, kill, lambda: out.done and err.done
                )
            except BaseException as exc:  # (an interrupt, too)
                # The runner may hold (part of) the action, unread or started: killed with
                # the action's processes, a fresh one next time.
                reader.eof = True
                _abort(self.group, kill, exc)
                raise
            if ended == "eof":
                # The runner died mid-action (an action can SIGKILL it: same uid): what the
                # action started is still in the group; kill it as at a time-out, or leave()
                # would move it out and it would outlive its time-out.
                kill("runner lost")
                # Its stream closed, so the runner is gone and done with its line: the kill's
                # revocation of the ticket (taken by then) is moot, and left, one empty
                # directory per runner lost stayed in /tmp for every later action to see.
                self.group.ended()
            elif ended == "stuck":
                # No end within the grace after the kill: the runner may not have read the
                # action yet (held: a loaded machine, a stop), the kill finding nothing of it;
                # spared, it started the action after its outcome was given, and leave()
                # moved what it started out of the group. Killed now, with what is left.
                self.group.drop_launcher()
                kill("stuck")
            else:
                self.group.ended()  # its end markers came: the runner is done with the line
        finally:
            self.group.leave()
        if ended in ("stuck", "eof"):
            self.close()  # a fresh runner next time
        code = out.code if out.done else None
        return RawResult(code, out.content(), err.content(), ended, out.total, err.total)

    def close(self) -> None:
        if self._attached is not None:
            self._attached.close()
        self._attached = None
        self._sock = None
        if self._reader is not None:
            self._reader.eof = True
        self._reader = None

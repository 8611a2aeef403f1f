"""`sandbox`: each program run in bubblewrap, in PID, mount, IPC, UTS and network namespaces of
its own, without capabilities. It sees the system's directories, this interpreter and the paths
the harness names, read-only; its working directory read-write; a private /tmp; only its own
processes. Its network namespace, made by this process, holds loopback and one listening socket
at 127.0.0.1:PORT served as the rollout's interception URL, which is all it can reach. Its
environment reaches bubblewrap through a memfd (`--args`), so no host process can read the
rollout's URL from bubblewrap's command line or environment. Killing bubblewrap ends the PID
namespace and every process in it; memory, pids and CPU hold for the whole tree (a cgroup, or
the watchdog: see tree.py).

`auto` picks this runtime where it works here and the subprocess runtime elsewhere, saying why
in one log line."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from rlbus.config.env import RuntimeConfig
from rlbus.producers.runtimes.base import (
    ExecResult,
    Mount,
    ProcessRuntime,
    RolloutEndpoint,
    allowed_variables,
    cpu_limit,
    die_with_parent,
    run_process,
)
from rlbus.producers.runtimes.linux import CAP_SYS_ADMIN, effective_capabilities
from rlbus.producers.runtimes.local import SubprocessRuntime
from rlbus.producers.runtimes.netns import make_netns, make_netns_blocking
from rlbus.producers.runtimes.tree import hold_tree

log = logging.getLogger(__name__)

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Read-only in every sandbox (a symlink, as on merged-/usr systems, stays a symlink)."""
ETC = (
    "passwd",
    "group",
    "hosts",
    "nsswitch.conf",
    "localtime",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "mime.types",
)
"""The parts of /etc programs commonly read; the rest (shadow, credentials) stays outside."""


@functools.cache
def _system_mounts() -> tuple[str, ...]:
    args: list[str] = []
    for path in SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in ETC:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return tuple(args)


@functools.cache
def sandbox_problem() -> str | None:
    """Why the sandbox runtime cannot run here (checked once, by running it), or None."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return (
            "bubblewrap is not installed (no `bwrap` on PATH; Debian: apt-get install bubblewrap)"
        )
    if not effective_capabilities() >> CAP_SYS_ADMIN & 1:
        return (
            "the sandbox's network namespace is made by this process, which needs CAP_SYS_ADMIN "
            f"(root); running as uid {os.geteuid()} without it"
        )
    try:
        netns = make_netns_blocking(None)
    except OSError as exc:
        return f"cannot make a network namespace: {exc}"
    try:
        done = subprocess.run(
            [bwrap, *_system_mounts(), "--unshare-pid", "--die-with-parent", "--", "true"],
            preexec_fn=netns.enter,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap did not run: {exc}"
    finally:
        netns.close()
    if done.returncode != 0:
        return f"bubblewrap failed here: {done.stderr.strip() or f'exit {done.returncode}'}"
    return None


def _mount_options(mount: Mount) -> tuple[str, ...]:
    if mount.source is None:
        return ("--tmpfs", mount.target, "--remount-ro", mount.target)
    return ("--bind" if mount.writable else "--ro-bind", str(mount.source), mount.target)


class SandboxRuntime(ProcessRuntime):
    kind = "sandbox"

    def __init__(self, config: RuntimeConfig):
        super().__init__(config)
        problem = sandbox_problem()
        if problem is not None:
            raise RuntimeError(f"the sandbox runtime cannot run here: {problem}")
        self.bwrap = shutil.which("bwrap") or "bwrap"

    def options(
        self,
        workdir: Path,
        env: dict[str, str],
        readable: Sequence[Path],
        mounts: Sequence[Mount] = (),
    ) -> list[str]:
        """bubblewrap's options for one program run (they travel in a memfd, not its argv)."""
        extra = [str(Path(p).resolve()) for p in self.config.read_only]
        visible = {sys.prefix, sys.base_prefix, *map(str, readable), *extra}
        return [
            *("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"),
            *("--die-with-parent", "--new-session", "--cap-drop", "ALL"),
            *("--hostname", "rlbus-sandbox", "--clearenv"),
            *(
                a
                for k, v in allowed_variables(self.config, workdir, env).items()
                for a in ("--setenv", k, v)
            ),
            *_system_mounts(),
            *("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"),
            # After /tmp: a path under it (a task set in a temporary directory) stays visible.
            *(a for path in sorted(visible) for a in ("--ro-bind-try", path, path)),
            *("--bind", str(workdir), str(workdir), "--chdir", str(workdir)),
            # Last: a mount hides what the paths above would show at its target.
            *(a for mount in mounts for a in _mount_options(mount)),
        ]

    async def launch(
        self,
        workdir: Path,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes | None,
        readable: Sequence[Path],
        endpoint: RolloutEndpoint | None,
        mounts: Sequence[Mount] = (),
    ) -> ExecResult:
        netns = await make_netns(endpoint.port if endpoint is not None else None)
        args = os.memfd_create("rlbus-bwrap-args")
        try:
            options = self.options(workdir, env, readable, mounts)
            os.write(args, "\0".join(options).encode() + b"\0")
            os.lseek(args, 0, os.SEEK_SET)
            limits = [cpu_limit(self.config.cpu_s)] if self.config.cpu_s is not None else []
            serving = (
                endpoint.serving(netns.listener)
                if endpoint is not None and netns.listener is not None
                else contextlib.nullcontext()
            )
            async with serving:
                return await run_process(
                    [self.bwrap, "--args", str(args), "--", *argv],
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                    cwd=workdir,
                    config=self.config,
                    stdin=stdin,
                    tree=hold_tree(self.config),
                    setup=[netns.enter, die_with_parent, *limits],
                    pass_fds=(args,),
                )
        finally:
            os.close(args)
            netns.close()


class AutoRuntime(ProcessRuntime):
    """The sandbox where it works here, else the subprocess runtime; decided at the first program
    run (harnesses that run no program never probe)."""

    kind = "auto"

    def __init__(self, config: RuntimeConfig):
        super().__init__(config)
        self._chosen: ProcessRuntime | None = None

    def chosen(self) -> ProcessRuntime:
        if self._chosen is None:
            problem = sandbox_problem()
            if problem is None:
                self._chosen = SandboxRuntime(self.config)
            else:
                log.warning(
                    "runtime auto: no sandbox here (%s); programs run in the subprocess runtime, "
                    "which is not a sandbox (they see this host's files, processes and network)",
                    problem,
                )
                self._chosen = SubprocessRuntime(self.config)
        return self._chosen

    async def launch(
        self,
        workdir: Path,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes | None,
        readable: Sequence[Path],
        endpoint: RolloutEndpoint | None,
        mounts: Sequence[Mount] = (),
    ) -> ExecResult:
        return await self.chosen().launch(workdir, argv, env, stdin, readable, endpoint, mounts)

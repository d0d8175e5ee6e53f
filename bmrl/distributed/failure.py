"""Peer failure: end this process at once when a multi-process run fails, naming the processes gone.

A process that raises normally would wait in `jax.distributed`'s shutdown barrier for peers that may be
dead, and they for it. `stop_after_failure` prints the error and which processes stopped sending
heartbeats (the bound is `bmrl.distributed.startup.HEARTBEAT_TIMEOUT_S`), then exits with
`EXIT_PEER_FAILED` without that barrier.
"""

from __future__ import annotations

import os

import jax

from bmrl.distributed._coordination import coordination_client

EXIT_PEER_FAILED = 4  # exit status of a process stopped because the run failed across processes


def dead_processes() -> list[int] | None:
    """The processes the coordination service no longer sees (their heartbeats stopped), or None when
    it cannot be asked (process 0, which hosts it, is gone)."""
    client = coordination_client()
    try:
        live = client.get_live_nodes(list(range(jax.process_count())))
    except Exception:  # noqa: BLE001 - the service itself is unreachable
        return None
    return [p for p in range(jax.process_count()) if p not in live]


def stop_after_failure(prog: str, err: BaseException) -> None:
    """End this process of a multi-process run at once after `err`, saying which processes are gone.

    A process that raises normally would wait in jax.distributed's shutdown barrier (minutes) for
    peers that may be dead, and they for it; so the error is printed, with the dead processes named,
    and the process exits with `EXIT_PEER_FAILED` without that barrier (`os._exit`). Checkpoints
    are safe: orbax commits a step only once every process has written it (a temporary directory
    is all a cut save leaves, removed on restart)."""
    import sys
    import traceback

    traceback.print_exception(err, file=sys.stderr)
    dead = dead_processes()
    me = jax.process_index()
    if dead is None:
        who = "process 0 (the coordinator) is unreachable: it stopped or its host is gone"
    elif dead:
        who = f"process{'es' if len(dead) > 1 else ''} {', '.join(map(str, dead))} stopped (no heartbeat)"
    else:
        who = "every process is still alive: the error above is this process's own"
    print(f"bmrl {prog}: process {me} of {jax.process_count()} stops: {type(err).__name__}; {who}. "
          f"Restart all processes with the same command to resume from the last complete checkpoint.",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_PEER_FAILED)


__all__ = ["EXIT_PEER_FAILED", "dead_processes", "stop_after_failure"]

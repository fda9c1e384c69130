"""Running a result scan (``providers.result_scan``) where it cannot stall the service.

A body that stayed in memory (``providers.spool``: at most a megabyte) is scanned in a
worker thread. A larger one, already in its unnamed file, is scanned by a child process
that gets the file's descriptor: parsing millions of lines in a thread would hold the
interpreter lock for a minute, and every request the service answers meanwhile would
wait for it (measured with a thread: ``/healthz`` p50 11 ms, p99 49 ms while one scan
ran; ``bench/results.py`` has the figures with the child). At most ``CHILD_SCANS`` run
at once in a process; further scans wait for a slot. A child that fails raises
``ScanFailed``: the fault is ours, not the provider's, and the step's own failure
handling retries it. A scan whose waiter is cancelled (shutdown) kills its child.
"""

from __future__ import annotations

import asyncio
import json
import sys
import weakref
from typing import BinaryIO

import anyio.to_thread

from reconciler.providers.result_scan import ScanPlan, ScanReport, scan_bytes

CHILD_SCANS = 2
_STDERR_CHARS = 300


class ScanFailed(RuntimeError):
    """The child process that scans a result did not report (killed, crashed, no Python)."""


_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        slots = _SLOTS[loop] = asyncio.Semaphore(CHILD_SCANS)
    return slots


async def scan(plan: ScanPlan, data: bytes | None, file: BinaryIO | None) -> ScanReport:
    """The report on a body: ``data`` when it is in memory, else ``file``."""
    if file is None:
        return await anyio.to_thread.run_sync(scan_bytes, plan, data or b"")
    async with _slots():
        return await _in_child(plan, file.fileno())


async def _in_child(plan: ScanPlan, fd: int) -> ScanReport:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-P",  # nothing from the working directory shadows the package
        "-m",
        "reconciler.providers.result_scan",
        str(fd),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        pass_fds=(fd,),
    )
    try:
        out, err = await child.communicate(json.dumps(plan.to_json()).encode())
    except BaseException:
        if child.returncode is None:
            child.kill()
            await child.wait()
        raise
    if child.returncode != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        last = lines[-1][:_STDERR_CHARS] if lines else "no message"
        raise ScanFailed(f"the result scan exited with status {child.returncode}: {last}")
    try:
        return ScanReport.from_json(json.loads(out))
    except (ValueError, KeyError, TypeError) as exc:
        raise ScanFailed(f"the result scan reported nothing readable: {exc}") from None

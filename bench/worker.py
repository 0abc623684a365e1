"""One benchmark worker process: ``python -m bench.worker SYSTEM DSN --mode drain --concurrency 10``.

The protocol with the orchestrator is a few lines: the worker prints
``READY`` once it is connected, starts when it reads ``GO`` on stdin, stops
early when it reads ``STOP``, prints ``DONE`` when its work ran out (and then
waits, still connected, for ``STOP``), and prints ``RESULT {json}`` before
exiting.
``EXIT`` makes it print its result and leave at once, for queues whose own
shutdown takes seconds after the measured work is over. Importing and
connecting happen before ``READY``, so the orchestrator's clock starts at
the first claim attempt of a warm process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import sys
import threading
from pathlib import Path

from .systems import Control, WorkerOptions, get


def _read_commands(control: Control, go: threading.Event) -> None:
    for line in sys.stdin:
        command = line.strip()
        if command == "GO":
            go.set()
        elif command == "STOP":
            go.set()
            control.request_stop()
        elif command == "EXIT":
            report(control)
            os._exit(0)
    go.set()  # stdin closed: the orchestrator is gone
    control.request_stop()


async def main(system_name: str, dsn: str, options: WorkerOptions) -> Control:
    control = Control(options)
    control.loop = asyncio.get_running_loop()
    runner = await get(system_name).open_worker(dsn, control)
    go = threading.Event()
    threading.Thread(target=_read_commands, args=(control, go), daemon=True).start()
    _say("READY")
    await asyncio.to_thread(go.wait)
    if not control.stop.is_set():
        await runner.run()
        # Stay connected until told: the orchestrator reads our database
        # backends' CPU time, which vanishes with the connections.
        _say("DONE")
        await control.stop.wait()
    await runner.close()
    return control


_reported = threading.Lock()
_printed = threading.Event()


_writing = threading.Lock()


def _say(line: str) -> None:
    """One line to the orchestrator in one write: print() writes the text and its newline
    apart, so a DONE from the loop and a RESULT from the reader thread could share a line."""
    with _writing:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def report(control: Control) -> None:
    """Print the RESULT line, once, whichever thread gets here first.

    The thread that comes second waits for the line to be out: the main
    thread returning from here ends the process, which would kill the
    reader thread (a daemon) halfway through printing it after ``EXIT``.
    """
    if _reported.acquire(blocking=False):
        _say("RESULT " + json.dumps(result(control)))
        _printed.set()
    else:
        _printed.wait(10)


def result(control: Control) -> dict:
    """What the orchestrator collects: handler start times, peak memory, CPU used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"done": control.done, "starts": dict(control.starts), "max_rss_mb": peak_rss_mb(),
            "cpu_s": usage.ru_utime + usage.ru_stime, **control.counters,
            **({"tool_s": control.tool_seconds} if control.tool_seconds else {})}


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM; ru_maxrss would include the parent's from before exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__.splitlines()[0])
    parser.add_argument("system")
    parser.add_argument("dsn")
    parser.add_argument("--mode", choices=("drain", "count", "latency", "hold", "io"), default="drain")
    parser.add_argument("--io-seconds", type=float, default=0.0, help="--mode io: each handler's awaited I/O")
    parser.add_argument("--lease-seconds", type=float, default=None, help="claim with this lease length")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--prefetch", type=int, default=0, help="tasks leased ahead of the slots (leaseq only)")
    parser.add_argument("--tool-calls", type=int, default=0,
                        help="tool calls each handler records through ctx.tool (leaseq only)")
    parser.add_argument("--target", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    control = asyncio.run(main(args.system, args.dsn, WorkerOptions(args.mode, args.concurrency, args.target,
                                                                            args.io_seconds, args.lease_seconds,
                                                                            args.prefetch, args.tool_calls)))
    report(control)


if __name__ == "__main__":
    cli()

"""The baseline of ``bench/poller.py`` part (b): a fixed-interval status poller, and the job mix.

    python bench/naive.py [--jobs 1000] [--seed 7] [--interval 2] [--low 10] [--high 600]
        [--smoke]

Pure and fast: job durations are drawn log-uniformly from a seeded ``random.Random`` and
the naive poller's reads follow from a duration in closed form (no clock, no sleeping).
The naive poller reads the status every ``interval`` seconds after submission, ignores
webhooks and provider guidance, and stops at the first read that sees the job finished.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections.abc import Sequence


def log_uniform_durations(count: int, low: float, high: float, rng: random.Random) -> list[float]:
    """``count`` job durations in seconds, log-uniform on [low, high]."""
    if not 0 < low <= high:
        raise ValueError("durations need 0 < low <= high")
    lo, hi = math.log(low), math.log(high)
    return [math.exp(rng.uniform(lo, hi)) for _ in range(count)]


def naive_reads(duration: float, interval: float) -> int:
    """Status reads of a poller that reads at interval, 2 x interval, ... until one sees the end.

    The job is finished from ``duration`` on, so the read at ``k x interval`` sees it done
    exactly when ``k x interval >= duration``: the count is ceil(duration / interval).
    """
    if interval <= 0:
        raise ValueError("the interval must be positive")
    return max(1, math.ceil(duration / interval))


def naive_detection_delay(duration: float, interval: float) -> float:
    """Seconds from the job's end to the read that sees it."""
    return naive_reads(duration, interval) * interval - duration


def summary(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "mean": statistics.fmean(ordered),
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "max": ordered[-1],
    }


def main() -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--low", type=float, default=10.0)
    parser.add_argument("--high", type=float, default=600.0)
    parser.add_argument("--smoke", action="store_true", help="100 jobs: proves it still runs")
    args = parser.parse_args()
    if args.smoke:
        args.jobs = 100
    durations = log_uniform_durations(args.jobs, args.low, args.high, random.Random(args.seed))
    reads = summary([naive_reads(d, args.interval) for d in durations])
    delay = summary([naive_detection_delay(d, args.interval) for d in durations])
    print(
        f"{args.jobs} jobs, durations log-uniform {args.low:g}-{args.high:g} s (seed {args.seed}); "
        f"naive poller every {args.interval:g} s"
    )
    print(
        f"status reads per operation: mean {reads['mean']:.2f}  p50 {reads['p50']:.0f}  "
        f"p99 {reads['p99']:.0f}  max {reads['max']:.0f}"
    )
    print(f"end -> seen: mean {delay['mean']:.2f} s  max {delay['max']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

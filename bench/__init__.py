"""leaseq's benchmark, side by side with pgqueuer, procrastinate and a raw psycopg ceiling.

    python -m bench                  # every workload, three alternating rounds
    python -m bench --quick          # the small configuration CI runs (about a minute)
    python -m bench drain latency    # some workloads only
    python -m bench --help

Each run creates a PostgreSQL database of its own (dropped at the end), and
each trial a fresh schema in it, so no trial sees another's rows. Workers
run as separate processes started through :mod:`bench.worker`. Results are
written as JSON and Markdown, with matplotlib plots, to ``--out``.
"""

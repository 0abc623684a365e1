"""Code changes under replay from the command line, on both backends: ``leaseq worker`` runs
with the version its App declares, and ``leaseq show`` (and its JSON) tells the version a task
started under and where its handler diverged from the recorded run."""

from __future__ import annotations

import json

import leaseq

APP = '''
import leaseq

app = leaseq.App(name="jobs", version="7")

@app.task("trip")
def trip(ctx, city):
    return ctx.tool(lambda c: {"city": c}, action="weather.get", effect="read_only")(city)
'''


def test_the_worker_runs_its_apps_version_and_show_tells_it(dsn, run_cli):
    (run_cli.cwd / "jobs.py").write_text(APP)
    with leaseq.connect(dsn) as q:
        q.migrate()
        done = q.enqueue("trip", {"city": "oslo"})
        diverged = q.enqueue("trip", {"city": "rome"}, idempotency_key="trip-rome")
        w = q.register_worker("by-hand", version="6")
        [claim] = q.claim(w)  # the older task first: started by hand under version 6
        assert claim.task_id == done.id
        q.complete(w, claim, {"city": "oslo"})
        [claim] = q.claim(w)
        fx = q.begin_effect(w, claim, "weather.get", "trip-rome:weather.get:0", effect="read_only",
                            args_digest="aa" * 16)
        q.finish_effect(w, claim, fx, {"city": "rome"})
        q.fail(w, claim, "crashed", delay=0)
    proc = run_cli("--dsn", dsn, "worker", "jobs:app", "--until-idle", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "version=7 serves=7" in proc.stderr, proc.stderr
    with leaseq.connect(dsn) as q:  # started under 6: the worker of version 7 left it alone
        assert (q.get(diverged.id).status, q.get(diverged.id).code_version) == ("queued", "6")
        w = q.register_worker("by-hand", version="7", compatible_versions=["6"])
        [claim] = q.claim(w)
        try:
            q.begin_effect(w, claim, "weather.get", "trip-rome:weather.get:0", effect="read_only",
                           args_digest="bb" * 16)
        except leaseq.ToolCallDiverged:
            pass
        assert q.get(diverged.id).status == "needs_reconciliation"
    shown = run_cli("--dsn", dsn, "show", str(diverged.id))
    assert shown.returncode == 0, shown.stderr
    assert "code version" in shown.stdout and "diverged" in shown.stdout, shown.stdout
    assert "trip-rome:weather.get:0" in shown.stdout, shown.stdout
    detail = json.loads(run_cli("--dsn", dsn, "show", str(diverged.id), "--json").stdout)
    assert detail["task"]["code_version"] == "6" and detail["task"]["status"] == "needs_reconciliation"
    [event] = [e for e in detail["events"] if e["type"] == "diverged"]
    assert event["detail"]["idempotency_key"] == "trip-rome:weather.get:0"
    assert json.loads(run_cli("--dsn", dsn, "show", str(done.id), "--json").stdout)["task"]["code_version"] == "6"

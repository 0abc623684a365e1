"""`leaseq chaos` options for the faults and the transport: refused clearly, before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from leaseq.cli.main import cli
from leaseq_chaos.config import ChaosConfig, default_faults

# `leaseq chaos` with the leaseq-chaos package out of reach (an import of it fails as if not installed)
WITHOUT_CHAOS = ("import sys; sys.modules['leaseq_chaos'] = None; sys.argv[0] = 'leaseq'; "
                 "from leaseq.cli.main import main; main()")


@pytest.mark.parametrize("args, says", [
    (["--faults", "service"], "service needs remote workers (--transport http or mixed)"),
    (["--backend", "sqlite", "--faults", "drop_queue,drop_ledger"], "drop_queue, drop_ledger need --backend postgres"),
    (["--faults", "revoke,meteor"], "unknown fault(s) meteor"),
])
def test_a_fault_the_run_cannot_inject_is_refused(args, says, tmp_path):
    result = CliRunner().invoke(cli, ["chaos", *args, "--history", str(tmp_path / "h.json")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: faults: ") and says in result.stderr, result.stderr
    assert not (tmp_path / "h.json").exists()


@pytest.mark.parametrize("value", ["-1", "65"])
def test_a_prefetch_out_of_range_is_refused_naming_it(value, tmp_path):
    result = CliRunner().invoke(cli, ["chaos", "--prefetch", value, "--history", str(tmp_path / "h.json")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: prefetch: must be an integer from 0 to 64"), result.stderr
    assert not (tmp_path / "h.json").exists()


def test_the_help_lists_every_fault_and_the_transports():
    out = CliRunner().invoke(cli, ["chaos", "--help"]).output
    for name in ("drop_queue", "drop_ledger", "revoke", "service", "--transport", "mixed"):
        assert name in out


@pytest.mark.parametrize("backend, transport, faults", [
    ("postgres", "direct", ("kill", "stop", "terminate", "restart", "partition", "skew", "drop_queue", "drop_ledger",
                            "revoke")),
    ("postgres", "mixed", ("kill", "stop", "terminate", "restart", "partition", "skew", "drop_queue", "drop_ledger",
                           "revoke", "service")),
    ("sqlite", "direct", ("kill", "stop", "skew", "revoke")),
    ("sqlite", "http", ("kill", "stop", "skew", "revoke", "service")),
])
def test_all_means_every_fault_the_backend_and_transport_support(backend, transport, faults):
    assert default_faults(backend, transport) == faults
    assert ChaosConfig(backend=backend, transport=transport, faults=("kill",)).faults == ("kill",)


def test_which_workers_are_remote():
    assert [ChaosConfig(transport="mixed", workers=4).remote(i) for i in range(4)] == [False, True, False, True]
    assert not any(ChaosConfig(transport="direct").remote(i) for i in range(8))
    assert all(ChaosConfig(transport="http").remote(i) for i in range(8))


@pytest.mark.parametrize("args", [["--duration", "5"], ["--recheck", __file__]])
def test_without_the_chaos_package_the_command_says_what_to_install(args, tmp_path):
    proc = subprocess.run([sys.executable, "-c", WITHOUT_CHAOS, "chaos", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: chaos: this command needs the leaseq-chaos package, which is not installed; from a checkout "
        "of the leaseq repository: python -m pip install -e ./chaos"], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    help_text = subprocess.run([sys.executable, "-c", WITHOUT_CHAOS, "chaos", "--help"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60)
    assert help_text.returncode == 0 and "--faults" in help_text.stdout  # the options are still described


@pytest.mark.parametrize("args, field, says", [
    (["--backend", "sqlite", "--portable"], "portable", "the portable mode is PostgreSQL's: it needs --backend postgres"),
    (["--backend", "sqlite", "--pooler", "pgbouncer"], "pooler", "it needs --backend postgres"),
])
def test_a_mode_the_backend_does_not_have_is_refused_naming_it(args, field, says, tmp_path):
    result = CliRunner().invoke(cli, ["chaos", *args, "--faults", "kill", "--history", str(tmp_path / "h.json")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {field}: ") and says in result.stderr, result.stderr
    assert not (tmp_path / "h.json").exists()

"""The package's type information, as a user's type checker sees it.

leaseq ships ``py.typed``; ``public_api.py`` uses the public API the way the
README and docs teach it, and must pass ``mypy --strict`` against the package
as installed (CI also runs ``mypy --strict src/leaseq`` itself). A fresh cache
under the test's tmp folder: nothing left over from another run is trusted.
"""

from __future__ import annotations

from pathlib import Path

from mypy import api

HERE = Path(__file__).resolve().parent


def test_the_documented_api_passes_mypy_strict(tmp_path: Path) -> None:
    stdout, stderr, status = api.run(["--strict", "--cache-dir", str(tmp_path / "mypy-cache"),
                                      "--no-error-summary", str(HERE / "public_api.py")])
    assert (status, stdout, stderr) == (0, "", "")


def test_the_package_ships_its_type_information() -> None:
    import leaseq

    assert (Path(leaseq.__file__).parent / "py.typed").is_file()

"""Playwright with Debian's chromium: the browser fixtures the dashboard tests share.

Without Chromium these tests skip, naming it (fail with ``LEASEQ_REQUIRE_TOOLS=1``
or ``LEASEQ_REQUIRE_BROWSER=1``, as in CI): see ``tests/system_tools.py``.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from system_tools import require_tool

from .conftest import Service


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of Debian's chromium; a skip naming it when it is missing (a failure when required)."""
    return require_tool("chromium")


#: For tests (or whole modules, as ``pytestmark``) that drive the browser.
needs_browser = pytest.mark.usefixtures("chromium")


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, svc: Service) -> Iterator[object]:
    context = browser.new_context(base_url=svc.url, viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    try:
        yield pg
    finally:
        context.close()


def login(page, token: str) -> None:
    page.goto("/")
    assert page.url.endswith("/login")
    page.fill("#token", token)
    page.click("#login")
    page.wait_for_url(re.compile(r"/$"))


def png_facts(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct scanlines) of a PNG, with the standard library only."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    channels = {2: 3, 6: 4, 0: 1, 4: 2}[data[25]]
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + width * channels
    rows = {raw[i:i + stride] for i in range(0, len(raw), stride)}
    return width, height, len(rows)

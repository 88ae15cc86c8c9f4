"""A real browser for the tests: Debian's Chromium, headless, driven by Selenium through Debian's chromedriver (no
browser is downloaded). `with chromium() as browser:` gives a WebDriver; `screenshot(browser, path)` keeps what a
person would see. Tests that need it skip, saying what to install, where Chromium or Selenium is missing."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WINDOW = (1280, 1000)
PAGE_LOAD_S = 120  # a page of inline pictures on a busy 2-core machine


def missing() -> str | None:
    """Why no browser can run here, or None."""
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        return "Debian's chromium is not installed (apt-get install chromium chromium-driver)"
    if not (Path(CHROMEDRIVER).exists() or shutil.which("chromedriver")):
        return "chromedriver is not installed (apt-get install chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@contextlib.contextmanager
def chromium(width: int = WINDOW[0], height: int = WINDOW[1]):
    why = missing()
    if why:
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--disable-extensions",
        "--no-first-run",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(
        service=Service(CHROMEDRIVER if Path(CHROMEDRIVER).exists() else shutil.which("chromedriver")), options=options
    )
    driver.set_page_load_timeout(PAGE_LOAD_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(condition, timeout: float = PAGE_LOAD_S, every: float = 0.2):
    """condition()'s first true value within timeout seconds, else AssertionError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not true within {timeout} s")


def screenshot(driver, path: Path, full_height: bool = False) -> Path:
    """What the page shows, as a PNG (the whole page's height when asked)."""
    if full_height:
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(WINDOW[0], min(int(height) + 40, 6000))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path

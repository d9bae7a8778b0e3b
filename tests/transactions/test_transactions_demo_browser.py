"""End to end: the demo served by `slmlab transactions demo` in a subprocess, driven by Debian's
headless chromium through Selenium, with every non-local host unresolvable (the page must work
offline and request nothing from the network). Screenshots of the six tabs go to the folder named by
``SLMLAB_DEMO_SCREENSHOTS`` when it is set; ``SLMLAB_DEMO_CHECKPOINT`` and ``SLMLAB_DEMO_DATA`` serve a
trained checkpoint and its bank instead of the few-step one made here."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                       reason="needs Debian's `chromium` and `chromium-driver` packages "
                              "(apt-get install -y chromium chromium-driver)"),
]
pytest.importorskip("gradio", reason="needs the demo extra (pip install -e '.[demo]')")
webdriver = pytest.importorskip("selenium.webdriver", reason="needs the demo extra (pip install -e '.[demo]')")
threadpool_limits = pytest.importorskip("threadpoolctl").threadpool_limits

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from slmlab.transactions import demo  # noqa: E402

BANK = dict(n_customers=120, n_days=60, n_physical_merchants=600, n_online_merchants=200, target_fraud_rate=0.01,
            seed=3)
TAB_NAMES = {"data": "Data", "next": "Next transaction", "scoring": "Fraud scoring",
             "similarity": "Customer similarity", "baselines": "Baselines", "model": "Model & schema"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the demo exited with {proc.returncode}: {proc.stdout.read()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"the demo did not listen on port {port} within {timeout:.0f} s")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("demo-browser")
    with threadpool_limits(1):  # gradient boosting's OpenMP pool stalls when oversubscribed
        if os.environ.get("SLMLAB_DEMO_CHECKPOINT"):  # a trained checkpoint, e.g. for the docs' screenshots
            state = demo.load_state(os.environ["SLMLAB_DEMO_CHECKPOINT"], os.environ["SLMLAB_DEMO_DATA"],
                                    baselines=False)
            state.paths.update(checkpoint=os.environ["SLMLAB_DEMO_CHECKPOINT"], bank=os.environ["SLMLAB_DEMO_DATA"])
        else:
            state = demo.quick_state(work, pretrain_steps=3, finetune_steps=3, synth_overrides=BANK, batch_size=8,
                                     stacked=False)  # the served process scores its own
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "slmlab.cli", "transactions", "demo", "--checkpoint",
                             str(state.paths["checkpoint"]), "--data", str(state.paths["bank"]), "--port", str(port),
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait_port(port, proc)
        yield state, port
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    from selenium.webdriver.chrome.service import Service

    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def _requested_urls(driver) -> list[str]:
    import json

    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def _open_tab(driver, name: str) -> None:
    tab = next(b for b in driver.find_elements(By.CSS_SELECTOR, "button[role='tab']") if b.text.strip() == name)
    tab.click()
    time.sleep(0.5)


# Gradio renders a dataframe's body as a virtual list (only rows near the viewport exist), so rows
# are collected while its scroller is stepped from top to bottom.
_SCROLLER = """
const body = document.querySelector(`#${arguments[0]} .virtual-body`);
if (!body) return null;
let el = body.parentElement;
while (el && el.scrollHeight <= el.clientHeight + 1) el = el.parentElement;
return el;
"""

_VISIBLE_ROWS = """
return Array.from(document.querySelectorAll(`#${arguments[0]} .virtual-row`)).map(r => [
    r.getAttribute('data-index'), Array.from(r.querySelectorAll("[role='gridcell']")).map(c => c.innerText)]);
"""


def _rows(driver, elem_id: str) -> list[list[str]]:
    """The body rows of a Gradio dataframe, as cell texts, in order."""
    rows: dict[int, list[str]] = {}
    scroller = driver.execute_script(_SCROLLER, elem_id)

    def grab():  # in one script, so rows recycled by the virtual list cannot go stale mid-read
        for index, cells in driver.execute_script(_VISIBLE_ROWS, elem_id):
            rows[int(index)] = [c.strip() for c in cells]

    grab()
    if scroller is not None and driver.execute_script("return arguments[0] !== document.documentElement", scroller):
        driver.execute_script("arguments[0].scrollTop = 0", scroller)
        while True:
            grab()
            at_end = driver.execute_script("const e = arguments[0]; const before = e.scrollTop; "
                                           "e.scrollTop = before + e.clientHeight / 2; return e.scrollTop === before;",
                                           scroller)
            time.sleep(0.05)
            if at_end:
                grab()
                break
    return [rows[i] for i in sorted(rows)]


def _shot(driver, name: str) -> None:
    folder = os.environ.get("SLMLAB_DEMO_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1400, max(1000, min(int(height) + 40, 3000)))
        time.sleep(0.5)
        driver.save_screenshot(str(Path(folder) / f"demo-{name}.png"))
        driver.set_window_size(1400, 1000)


def test_demo_in_a_headless_browser(served, browser):
    state, port = served
    driver, wait = browser, WebDriverWait(browser, 120)
    driver.get(f"http://127.0.0.1:{port}/")
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#data-table .virtual-row")))
    # pick a customer: the second listed one, typed into the picker
    cid = state.customer_ids()[1]
    box = driver.find_element(By.CSS_SELECTOR, "#customer input")
    box.click()
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(cid, Keys.ENTER)
    expected = demo.customer_frame(state, cid)
    n_shown = min(len(expected), demo.VIEW_ROWS)
    wait.until(lambda d: (r := _rows(d, "data-table")) and r[-1][0] == str(len(expected) - 1) and len(r) == n_shown)
    driver.find_element(By.CSS_SELECTOR, "#highlight input").click()  # ground-truth fraud tinted, columns added
    wait.until(lambda d: "fraud_type" in [th.text.strip() for th in d.find_elements(By.CSS_SELECTOR, "#data-table thead th")])
    _shot(driver, "data")

    _open_tab(driver, TAB_NAMES["scoring"])
    driver.find_element(By.ID, "score").click()
    wait.until(lambda d: len(_rows(d, "score-table")) == n_shown)
    header = [th.text.strip() for th in driver.find_elements(By.CSS_SELECTOR, "#score-table thead th")]
    col = next(i for i, h in enumerate(header) if h.startswith("score"))
    scores = [float(r[col]) for r in _rows(driver, "score-table")]
    assert len(scores) == n_shown and all(0.0 <= s <= 1.0 for s in scores)
    driver.find_element(By.ID, "occlusion").click()
    wait.until(lambda d: len(_rows(d, "occlusion-table")) == 15)
    _shot(driver, "scoring")

    _open_tab(driver, TAB_NAMES["next"])
    driver.find_element(By.ID, "predict").click()
    wait.until(lambda d: all(len(_rows(d, f"head-{f}")) == 5 for f in range(15)))
    assert len(driver.find_elements(By.CSS_SELECTOR, ".head-table")) == 15
    assert len(_rows(driver, "samples")) == 5
    _shot(driver, "next")

    _open_tab(driver, TAB_NAMES["similarity"])
    driver.find_element(By.ID, "embed").click()
    wait.until(lambda d: len(_rows(d, "neighbours")) == 5)
    _shot(driver, "similarity")
    for key in ("baselines", "model"):
        _open_tab(driver, TAB_NAMES[key])
        _shot(driver, key)

    # offline: nothing but the local server was asked for anything
    urls = _requested_urls(driver)
    remote = sorted({u for u in urls if u.startswith(("http:", "https:", "ws:", "wss:"))
                     and not u.split("//", 1)[1].startswith(f"127.0.0.1:{port}/")})
    assert any(f"127.0.0.1:{port}/" in u for u in urls) and remote == []

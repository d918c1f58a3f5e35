"""The admin web page at / in a real headless browser (Debian's chromium,
driven by selenium through chromium-driver; scripts/install-system-deps
installs both): it shows a topic and an open transaction made by the
client, refreshes by itself, and its abort button aborts the transaction.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerProcess
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from client import Client

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def test_page_is_served_at_the_root(broker: BrokerProcess) -> None:
    with urllib.request.urlopen(broker.url + "/", timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/html")
        page = answer.read().decode()
    assert "<title>txnbuf broker</title>" in page
    for path in ('"/admin/v1"', "/coordinators", "/topics", "/transactions", "/abort", "/metrics"):
        assert path in page, path


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    for program in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is missing: run scripts/install-system-deps")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1400,1000",
    ):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def cells(row: WebElement) -> list[str]:
    return [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]


def abort_from_the_page(
    driver: WebDriver, url: str, topic: str, txnid: str, screenshot: Path
) -> dict[str, Any]:
    """Open the page, check what it shows, click the transaction's abort
    button and confirm; returns what the page showed."""
    wait = WebDriverWait(driver, 15)
    driver.get(url + "/")
    try:
        topic_row = wait.until(
            ec.presence_of_element_located((By.CSS_SELECTOR, f'tr.topic[data-topic="{topic}"]'))
        )
        sub_row = driver.find_element(
            By.CSS_SELECTOR, f'tr.sub[data-topic="{topic}"][data-subscription="page-sub"]'
        )
        txn_row = wait.until(
            ec.presence_of_element_located((By.CSS_SELECTOR, f'tr[data-txnid="{txnid}"]'))
        )
        seen: dict[str, Any] = {
            "topic": cells(topic_row),
            "subscription": cells(sub_row),
            "transaction": txn_row.text,
            "state": txn_row.find_element(By.CSS_SELECTOR, "td.state").text,
            "coordinators": driver.find_element(By.ID, "coordinators").text,
        }
        # The page refreshes by itself: a rate needs two readings.
        rate_cell = f'tr.topic[data-topic="{topic}"] td:nth-child(4)'
        wait.until(
            lambda d: re.fullmatch(r"\d+\.\d", d.find_element(By.CSS_SELECTOR, rate_cell).text)
        )
        seen["in_rate"] = driver.find_element(By.CSS_SELECTOR, rate_cell).text
        driver.find_element(By.CSS_SELECTOR, f'button.abort[data-txnid="{txnid}"]').click()
        wait.until(ec.alert_is_present()).accept()
        wait.until(ec.text_to_be_present_in_element((By.ID, "message"), "ABORTED"))
        seen["message"] = driver.find_element(By.ID, "message").text
        wait.until(
            ec.invisibility_of_element_located((By.CSS_SELECTOR, f'tr[data-txnid="{txnid}"]'))
        )
        return seen
    except TimeoutException:
        driver.save_screenshot(str(screenshot))
        raise AssertionError(
            f"the page did not show what was expected (screenshot {screenshot}):\n"
            + driver.find_element(By.TAG_NAME, "body").text
        ) from None


@pytest.mark.integration
async def test_page_shows_topic_and_transaction_and_aborts_it(
    broker: BrokerProcess, browser: WebDriver, tmp_path: Path
) -> None:
    topic = "page-topic"
    async with Client(broker.url) as client:
        consumer = await client.subscribe(topic, "page-sub", initial_position="earliest")
        producer = await client.create_producer(topic)
        for i in range(3):
            await producer.send(b"plain %d" % i)
        txn = await client.new_transaction(timeout=600)
        await producer.send(b"in the transaction", txn=txn)
        await consumer.acknowledge(await consumer.receive(timeout=10), txn=txn)
        txnid = str(txn.id)

        seen = await asyncio.to_thread(
            abort_from_the_page, browser, broker.url, topic, txnid, tmp_path / "page.png"
        )

    assert seen["state"] == "OPEN"
    assert f"{topic} partition 0" in seen["transaction"]
    assert f"{topic} subscription page-sub" in seen["transaction"]
    # topic: name, partitions, messages, ..., producers, consumers
    assert seen["topic"][:3] == [topic, "1", "3"] and seen["topic"][8:10] == ["1", "1"]
    # subscription: backlog 3 (one of them PENDING_ACK in the transaction),
    # unacked (delivered, not acknowledged) 2, PENDING_ACK 1, consumers 1
    sub = seen["subscription"]
    assert sub[0] == "page-sub" and sub[5:8] == ["3", "2", "1"], sub
    assert sub[9:] == ["1", "exclusive"], sub
    assert "OPEN" in seen["coordinators"]
    assert float(seen["in_rate"]) >= 0
    assert seen["message"] == f"Transaction {txnid}: ABORTED"

    status, body = broker.admin("GET", f"/admin/v1/transactions/{txnid}")
    assert status == 200
    assert json.loads(body)["status"] == "ABORTED"


STUCK_CASES = """
const now = Date.now();
const base = {tc_id: 0, start_ms: now - 1000, timeout_ms: 60000, partitions: [],
              subscriptions: [], timed_out: false};
renderTransactions([
  {...base, txnid: "(0,1)", status: "OPEN"},
  {...base, txnid: "(0,2)", status: "STUCK"},
  {...base, txnid: "(0,3)", status: "COMMITTING", stuck: "partition t-0 has not answered for 60 s"},
  {...base, txnid: "(0,4)", status: "OPEN", stuck: {reason: "no coordinator"}},
], now);
return [...document.querySelectorAll("#transactions tbody tr")].map(
  (row) => [row.dataset.txnid, row.className, row.querySelector("td.state").textContent,
            [...row.querySelectorAll(".badge.stuck")].map((b) => b.textContent).join()]);
"""


def test_page_marks_stuck_transactions(broker: BrokerProcess, browser: WebDriver) -> None:
    # The page's own rendering, given transactions as the admin API may
    # report a stuck one: a STUCK state, or a `stuck` field with a reason.
    browser.get(broker.url + "/")
    WebDriverWait(browser, 15).until(lambda d: d.find_element(By.ID, "updated").text != "never")
    live = browser.find_element(By.ID, "live")
    live.click()  # (no refresh may replace what is rendered here)
    assert not live.is_selected()
    rows = browser.execute_script(STUCK_CASES)
    assert rows == [
        ["(0,1)", "", "OPEN", ""],
        ["(0,2)", "stuck", "STUCK", "stuck"],
        ["(0,3)", "stuck", "COMMITTING", "stuck: partition t-0 has not answered for 60 s"],
        ["(0,4)", "stuck", "OPEN", "stuck: no coordinator"],
    ]
    summary = browser.find_element(By.ID, "txn-summary").text
    assert summary == "4 in progress, 0 long-running, 3 stuck"

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
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from client import Client
from tests._cluster import (
    owner_id,
    start_placed,
    topic_on,
)
from tests.conftest import BrokerProcess

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def test_page_is_served_at_the_root(broker: BrokerProcess) -> None:
    with urllib.request.urlopen(broker.url + "/", timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/html")
        page = answer.read().decode()
    assert "<title>txnbuf broker</title>" in page
    for path in (
        '"/admin/v1"',
        "/coordinators",
        "/topics",
        "/transactions",
        '"abort"',
        '"resolve"',
    ):
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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # (the console, for errors)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def click(wait: WebDriverWait[WebDriver], selector: str) -> None:
    """Click the element ``selector`` finds; the page redraws its tables
    every refresh, so an element found just before a redraw is gone when
    clicked: find it again then."""

    def clicked(driver: WebDriver) -> bool:
        try:
            driver.find_element(By.CSS_SELECTOR, selector).click()
        except StaleElementReferenceException:
            return False
        return True

    wait.until(clicked)


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
        click(wait, f'button.abort[data-txnid="{txnid}"]')
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
        txn.flush()  # (the full path: the broker knows its participants while it is open)
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


def skip_from_the_page(driver: WebDriver, url: str, txnid: str, screenshot: Path) -> dict[str, Any]:
    """Open the page, check the stuck transaction's row, click its Skip
    button and confirm; returns what the page showed."""
    wait = WebDriverWait(driver, 20)
    driver.get(url + "/")
    row = f'tr.stuck[data-txnid="{txnid}"]'
    try:
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, row)))
        seen: dict[str, Any] = {
            "cells": cells(driver.find_element(By.CSS_SELECTOR, row)),
            "buttons": [b.text for b in driver.find_elements(By.CSS_SELECTOR, f"{row} button")],
            "summary": driver.find_element(By.ID, "txn-summary").text,
        }
        click(wait, f'button.skip[data-txnid="{txnid}"]')
        wait.until(ec.alert_is_present()).accept()
        wait.until(ec.text_to_be_present_in_element((By.ID, "message"), "skip on"))
        seen["message"] = driver.find_element(By.ID, "message").text
        wait.until(ec.invisibility_of_element_located((By.CSS_SELECTOR, row)))
        return seen
    except TimeoutException:
        driver.save_screenshot(str(screenshot))
        raise AssertionError(
            f"the page did not show what was expected (screenshot {screenshot}):\n"
            + driver.find_element(By.TAG_NAME, "body").text
        ) from None


@pytest.mark.integration
async def test_page_shows_a_stuck_transaction_and_skips_its_participant(
    tmp_path: Path, browser: WebDriver
) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.env["TXNBUF_REFUSE"] = "broker.end_txn_on_participant"  # the partition never applies
    broker.start()
    try:
        async with Client(broker.url) as client:
            producer = await client.create_producer("out")
            txn = await client.new_transaction(timeout=60)
            await producer.send(b"never applied", txn=txn)
            txn.flush()  # (the full path: a local commit tells no participant)
            await txn.commit()  # decided; the partition refuses to apply it
            txnid = str(txn.id)
            seen = await asyncio.to_thread(
                skip_from_the_page, browser, broker.url, txnid, tmp_path / "page.png"
            )
        status, body = broker.admin("GET", f"/admin/v1/transactions/{txnid}")
    finally:
        broker.stop()

    txnid_cell, _, state, _, _, participants, flags, _ = seen["cells"]
    assert (txnid_cell, state, participants) == (txnid, "COMMITTING", "out partition 0")
    assert flags.startswith("stuck on partition out/0: ") and "TXNBUF_REFUSE" in flags
    assert seen["buttons"] == ["Retry", "Skip"]  # (the coordinator refuses to abort it)
    assert seen["summary"] == "1 in progress, 0 long-running, 1 stuck"
    assert seen["message"] == f"Transaction {txnid}: skip on 1 participant(s)"
    assert status == 200
    meta = json.loads(body)
    assert meta["status"] == "COMMITTED" and meta["stuck"] == []


def sign_in_on_the_page(driver: WebDriver, url: str, token: str, screenshot: Path) -> list[str]:
    """Open the page of a broker that authenticates: what its status says
    before and after the token is typed in."""
    wait = WebDriverWait(driver, 15)
    driver.get(url + "/")
    try:
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "token needed"))
        before = driver.find_element(By.ID, "status").text
        field = driver.find_element(By.ID, "token")
        field.send_keys(token)
        field.send_keys(Keys.TAB)  # (a change event)
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "broker up"))
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, 'tr[data-topic="signed"]')))
        return [before, driver.find_element(By.ID, "status").text]
    except TimeoutException:
        driver.save_screenshot(str(screenshot))
        raise AssertionError(
            f"the page did not show what was expected (screenshot {screenshot}):\n"
            + driver.find_element(By.TAG_NAME, "body").text
        ) from None


@pytest.mark.integration
async def test_page_of_a_broker_that_authenticates_asks_for_a_token(
    tmp_path: Path, browser: WebDriver
) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", auth=True)
    broker.start()
    try:
        status, _ = broker.admin("PUT", "/admin/v1/topics/signed", b"{}")
        assert status == 200
        assert broker.token is not None
        before, after = await asyncio.to_thread(
            sign_in_on_the_page, browser, broker.url, broker.token, tmp_path / "page.png"
        )
    finally:
        broker.stop()
    assert before.startswith("token needed: /admin/v1/") and "needs a token" in before
    assert after == "broker up"


def test_favicon_is_served(broker: BrokerProcess) -> None:
    for path in ("/favicon.ico", "/favicon.svg"):
        with urllib.request.urlopen(broker.url + path, timeout=10) as answer:
            assert answer.status == 200
            assert answer.headers["Content-Type"] == "image/svg+xml"
            assert answer.read().startswith(b"<svg")


# What `first_render` reads once the spare is shown, in one script: the page
# redraws its tables at every refresh, so elements found one by one may be
# gone (stale) by the next read on a slow machine.
_FIRST_RENDER_REST = """
const texts = (selector) =>
    Array.from(document.querySelectorAll(selector), (e) => e.innerText.trim());
const spare = document.querySelector("tr.spare");
if (spare === null) { return null; }
const header = texts("#coordinators thead th");
const column = header.indexOf("OPEN");
return {
    spare: spare.innerText,
    summary: document.getElementById("txn-summary").innerText,
    spares: texts("td.spares"),
    header: header,
    open: Array.from(
        document.querySelectorAll("#coordinators tbody tr"),
        (row) => row.querySelectorAll("td")[column].innerText.trim()),
    cluster_hidden: document.getElementById("cluster").offsetParent === null,
};
"""


def first_render(driver: WebDriver, url: str, topic: str, screenshot: Path) -> dict[str, Any]:
    """What the page shows the first time it shows ``topic``."""
    wait = WebDriverWait(driver, 20)
    driver.get(url + "/")
    try:
        topic_cells = wait.until(
            lambda d: d.execute_script(
                "const row = document.querySelector(arguments[0]);"
                " return row && Array.from(row.querySelectorAll('td'), (c) => c.innerText.trim());",
                f'tr.topic[data-topic="{topic}"]',
            )
        )
        seen: dict[str, Any] = {"topic": topic_cells}
        seen.update(wait.until(lambda d: d.execute_script(_FIRST_RENDER_REST)))
        seen["console"] = [
            entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")
        ]
        return seen
    except TimeoutException:
        driver.save_screenshot(str(screenshot))
        raise AssertionError(
            f"the page did not show what was expected (screenshot {screenshot}):\n"
            + driver.find_element(By.TAG_NAME, "body").text
        ) from None


@pytest.mark.integration
async def test_first_render_has_rates_an_icon_and_a_labelled_spare(
    broker: BrokerProcess, browser: WebDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rates on the first render (not from the second refresh on), no 404
    in the console (the favicon), and a client's spare transaction shown
    as such and not counted as in progress."""
    import client._spares

    monkeypatch.setattr(client._spares, "MAX_AGE", 120.0)  # (the spare waits for the page)
    topic = "first-render"
    async with Client(broker.url) as c:
        producer = await c.create_producer(topic)
        async with c.transaction(timeout=600) as txn:  # (its END opens a spare)
            await producer.send(b"x", txn=txn)
        seen = await asyncio.to_thread(
            first_render, browser, broker.url, topic, tmp_path / "page.png"
        )
    assert re.fullmatch(r"\d+\.\d", seen["topic"][3]), seen["topic"]  # In msg/s
    assert "spare, unused" in seen["spare"] and "OPEN" in seen["spare"]
    assert seen["summary"].startswith("0 in progress"), seen["summary"]
    assert "1 spare opened ahead by clients, unused" in seen["summary"]
    # The coordinators' table counts the spare apart, not as OPEN.
    assert sum(map(int, seen["spares"])) == 1 and sum(map(int, seen["open"])) == 0, seen
    assert seen["cluster_hidden"]  # (a single broker has no cluster view)
    assert seen["console"] == []


def cluster_view(
    driver: WebDriver, url: str, brokers: int, topic: str, screenshot: Path
) -> dict[str, Any]:
    """What the page's cluster view shows once it lists ``brokers`` live
    brokers, and ``topic``'s rate once it is above 0."""
    wait = WebDriverWait(driver, 30)
    driver.get(url + "/")
    try:
        wait.until(
            lambda d: (
                len(d.find_elements(By.CSS_SELECTOR, "#brokers tbody tr:not(.dead)")) == brokers
                and d.find_elements(By.CSS_SELECTOR, "#moves tbody tr.move")
            )
        )
        rate_cell = f'tr.topic[data-topic="{topic}"] td:nth-child(4)'

        def rated(d: WebDriver) -> bool:
            try:
                return float(d.find_element(By.CSS_SELECTOR, rate_cell).text or 0) > 0
            except (NoSuchElementException, StaleElementReferenceException):
                return False

        wait.until(rated)

        def shown(d: WebDriver) -> dict[str, Any] | None:
            """The view as shown (None: redrawn while read, read again)."""
            try:
                rows = d.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")
                return {
                    "brokers": {r.get_attribute("data-broker"): cells(r) for r in rows},
                    "this": [
                        r.get_attribute("data-broker")
                        for r in rows
                        if "this" in (r.get_attribute("class") or "")
                    ],
                    "moves": [
                        cells(r) for r in d.find_elements(By.CSS_SELECTOR, "#moves tbody tr")
                    ],
                    "summary": d.find_element(By.ID, "cluster-summary").text,
                }
            except StaleElementReferenceException:
                return None

        seen: dict[str, Any] = wait.until(shown)
        seen["console"] = [
            e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")
        ]
        return seen
    except TimeoutException:
        driver.save_screenshot(str(screenshot))
        raise AssertionError(
            f"the page did not show the cluster (screenshot {screenshot}):\n"
            + driver.find_element(By.TAG_NAME, "body").text
        ) from None


@pytest.mark.integration
async def test_cluster_view_shows_brokers_slots_and_moves(
    tmp_path: Path,
    pg_url: str,
    browser: WebDriver,
    logs: list[BrokerProcess],
) -> None:
    """Three brokers over one PostgreSQL: the page of any of them shows the
    three with their leases and slots (as the slots table holds them), the
    recent moves, and the rate of a topic another broker serves."""
    held = await start_placed(tmp_path, pg_url, logs)
    home = logs[1]
    topic = topic_on(held, logs[2], "rated")  # (another broker's)
    async with Client(home.url) as client:
        producer = await client.create_producer(topic)

        async def sending() -> None:  # (until the page shows the topic's rate)
            while True:
                await producer.send(b"x")
                await asyncio.sleep(0.02)

        feeding = asyncio.create_task(sending())
        try:
            seen = await asyncio.to_thread(
                cluster_view, browser, home.url, 3, topic, tmp_path / "page.png"
            )
        finally:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
    assert seen["this"] == [owner_id(home)]
    assert set(seen["brokers"]) == {owner_id(p) for p in logs}
    for broker, row in seen["brokers"].items():
        assert row[2] == "live" and row[0].startswith(broker), row
        assert int(row[5]) == len(held[broker]), (row, held[broker])
    assert "3 live broker(s), 64 slots" in seen["summary"]
    assert {row[5] for row in seen["moves"]} <= {"balance", "failover", "handover", "restart"}
    assert seen["console"] == []

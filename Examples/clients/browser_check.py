#!/usr/bin/env python3
"""Checks feed-server's live page (`GET /`) in headless Chromium, driven by selenium.

    Examples/clients/install-chromium.sh     # Debian's chromium and chromium-driver, if missing
    Examples/clients/setup.sh
    Examples/.venv/bin/python Examples/clients/browser_check.py \\
        --server 127.0.0.1:8080 --screenshot Examples/results/live-page.png --timeout 60

Opens the page in a 1000x700 window, waits until #status reads `ready`, publishes three
messages by typing into #publish-text and clicking #publish-button and a fourth with
POST /publish from Python, waits until all four are in #messages (newest first), checks
that #online shows a count of at least 1, and saves a screenshot. Then topics: a bad
name in #topic is refused on the page (#topic-error), switching to `room-1` reconnects
(#current-topic, #status `ready`, feed's messages gone); a message POSTed to room-1 shows, one
POSTed to `feed` does not (proved by a later room-1 message showing without it), one
typed on the page goes to room-1; and the page opened as `/?topic=room-2` is on room-2.
Then reconnects, on a topic of its own: the page's socket is closed under it while two
messages are published; the page reconnects with `since` and `epoch`, shows both, in order,
and #status `recovered` (#recovery names them); then the browser is offline (DevTools'
Network.emulateNetworkConditions) for 6.5 s, so that the page's topic ends on the server (5 s without a
client) and starts again with another epoch: the page comes back with `resync` and the
reason in #recovery, and shows the next message.

Prints `PASS name` or `FAIL name: reason` per check and `N passed, N failed` last;
exits 1 if any check failed. Uses /usr/bin/chromium and /usr/bin/chromedriver
(CHROMIUM and CHROMEDRIVER override them).
"""
from __future__ import annotations

import argparse
import http.client
import os
import sys
import time
import uuid

from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from checks import Checks

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")



def post_publish(server: str, text: str, timeout: float, path: str = "/publish") -> int:
    host, _, port = server.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, body=text.encode(), headers={"Content-Type": "text/plain; charset=utf-8"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def start_browser(timeout: float) -> webdriver.Chrome:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            raise FileNotFoundError(f"{path} is missing: run Examples/clients/install-chromium.sh")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1000,700", "--hide-scrollbars", "--no-first-run",
                     "--disable-extensions", "--disable-background-networking"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=os.devnull)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(timeout)
    driver.set_script_timeout(timeout)
    # Make the page's viewport (what the screenshot shows) 1000x700, whatever the window's frame takes.
    driver.set_window_size(1000, 700)
    inner_width, inner_height = driver.execute_script("return [window.innerWidth, window.innerHeight];")
    driver.set_window_size(2000 - inner_width, 1400 - inner_height)
    return driver


def text_of(driver: webdriver.Chrome, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).get_attribute("textContent") or ""


def message_texts(driver: webdriver.Chrome) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#messages li'), li => li.textContent);")


def run(args: argparse.Namespace, checks: Checks) -> None:
    end = time.monotonic() + args.timeout

    def left() -> float:
        return max(0.1, end - time.monotonic())

    driver = start_browser(left())
    try:
        print(f"info: {driver.capabilities.get('browserName')} {driver.capabilities.get('browserVersion')}", flush=True)
        url = f"http://{args.server}/"
        try:
            driver.get(url)
            ids = ["status", "online", "gaps", "messages", "publish-text", "publish-button"]
            missing = [i for i in ids if not driver.find_elements(By.ID, i)]
            checks.check("page-loads", not missing, f"no element with id {', '.join(missing)}")
        except WebDriverException as error:
            checks.check("page-loads", False, f"GET {url}: {error.msg}")
            return

        try:
            WebDriverWait(driver, left()).until(lambda d: text_of(d, "status") == "ready")
            checks.check("status-ready", True)
        except TimeoutException:
            checks.check("status-ready", False, f"#status still reads {text_of(driver, 'status')!r}")
            return

        run_id = uuid.uuid4().hex[:6]
        texts = [f"hello from Chromium #{i} ({run_id})" for i in (1, 2, 3)]
        problem = ""
        for text in texts:
            field = driver.find_element(By.ID, "publish-text")
            field.clear()
            field.send_keys(text)
            driver.find_element(By.ID, "publish-button").click()
            try:  # the page clears the field once POST /publish answered 200
                WebDriverWait(driver, left()).until(
                    lambda d: d.find_element(By.ID, "publish-text").get_attribute("value") == "")
            except TimeoutException:
                result = text_of(driver, "publish-result") if driver.find_elements(By.ID, "publish-result") else ""
                problem = f"{text!r} not published after the click ({result or 'field not cleared'})"
                break
        checks.check("publish-from-page", not problem, problem)

        python_text = f"hello from Python #4 ({run_id})"
        try:
            status = post_publish(args.server, python_text, min(left(), 10))
            checks.check("publish-from-python", status == 200, f"POST /publish answered {status}")
        except OSError as error:
            checks.check("publish-from-python", False, f"POST /publish: {error}")
        expected = texts + [python_text]

        def shown() -> list[str]:
            return [t for t in expected if any(t in item for item in message_texts(driver))]

        try:
            WebDriverWait(driver, left()).until(lambda d: len(shown()) == len(expected))
            checks.check("messages-shown", True)
        except TimeoutException:
            checks.check("messages-shown", False, f"#messages shows {len(shown())} of 4: missing "
                         f"{[t for t in expected if t not in shown()]}")
        items = message_texts(driver)
        positions = [next((i for i, item in enumerate(items) if t in item), None) for t in reversed(expected)]
        in_order = None not in positions and positions == sorted(positions)
        checks.check("messages-newest-first", in_order, f"positions of #4..#1 in #messages: {positions}")
        checks.check("messages-at-most-100", len(items) <= 100, f"{len(items)} items")

        def online_count() -> int | None:
            text = text_of(driver, "online").strip()
            return int(text) if text.isdigit() else None

        try:  # `online` comes at most once a second
            WebDriverWait(driver, min(left(), 5)).until(lambda d: (online_count() or 0) >= 1)
            checks.check("online-count", True)
        except TimeoutException:
            checks.check("online-count", False, f"#online reads {text_of(driver, 'online')!r}")

        gaps = text_of(driver, "gaps")
        checks.check("no-gaps", gaps.startswith("0 "), f"#gaps reads {gaps!r}")

        try:
            errors = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        except WebDriverException:
            errors = []
        checks.check("no-console-errors", not errors, "; ".join(errors[:3]))

        if args.screenshot:
            path = os.path.abspath(args.screenshot)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            driver.execute_script("document.activeElement && document.activeElement.blur();")
            ok = driver.save_screenshot(path)
            with open(path, "rb") as file:
                is_png = file.read(8) == b"\x89PNG\r\n\x1a\n"
            checks.check("screenshot", ok and is_png, f"could not write {path}")
            print(f"info: screenshot {path}", flush=True)

        check_topics(driver, args, checks, left, expected)
        check_reconnect(driver, args, checks, left)
    finally:
        try:
            driver.quit()
        except Exception:  # noqa: BLE001 - quitting at the end
            pass


def check_topics(driver: webdriver.Chrome, args: argparse.Namespace, checks: Checks, left, on_feed: list[str]) -> None:
    """`on_feed`: the messages the page showed on `feed`, which the switch must clear."""
    run_id = uuid.uuid4().hex[:6]
    missing = [i for i in ("topic", "topic-button", "topic-error", "current-topic") if not driver.find_elements(By.ID, i)]
    if not checks.check("topic-box", not missing and text_of(driver, "current-topic") == "feed",
                        f"no element with id {', '.join(missing)}" if missing
                        else f"#current-topic reads {text_of(driver, 'current-topic')!r}, not 'feed'"):
        return

    def enter_topic(name: str) -> None:
        field = driver.find_element(By.ID, "topic")
        field.clear()
        field.send_keys(name)
        driver.find_element(By.ID, "topic-button").click()

    def on_topic(name: str) -> bool:
        # Switching sets #current-topic and #status `connecting` together: `ready` after that is the new socket's.
        return text_of(driver, "current-topic") == name and text_of(driver, "status") == "ready"

    # A bad name is refused on the page, which stays where it was.
    enter_topic("Room 1")
    error = text_of(driver, "topic-error")
    checks.check("topic-bad-refused", error.strip() != "" and on_topic("feed"),
                 f"#topic-error {error!r}, #current-topic {text_of(driver, 'current-topic')!r}, "
                 f"#status {text_of(driver, 'status')!r}")

    enter_topic("room-1")
    try:
        WebDriverWait(driver, min(left(), 15)).until(lambda d: on_topic("room-1"))
        # The list starts afresh (a replay of room-1's last message may be in it, nothing of feed's).
        stale = [t for t in on_feed if any(t in item for item in message_texts(driver))]
        ok = not stale and text_of(driver, "topic-error") == ""
        checks.check("topic-switch", ok, f"after the switch #messages still shows {stale[:2]}, "
                     f"#topic-error {text_of(driver, 'topic-error')!r}")
    except TimeoutException:
        checks.check("topic-switch", False, f"#current-topic {text_of(driver, 'current-topic')!r}, "
                     f"#status {text_of(driver, 'status')!r}")
        return

    def publish(text: str, path: str) -> bool:
        try:
            status = post_publish(args.server, text, min(left(), 10), path)
        except OSError as error:
            checks.check(f"topic-publish {path}", False, f"POST {path}: {error}")
            return False
        return checks.check(f"topic-publish {path}", status == 200, f"POST {path} answered {status}")

    def wait_shown(text: str, seconds: float) -> bool:
        try:
            WebDriverWait(driver, min(left(), seconds)).until(
                lambda d: any(text in item for item in message_texts(d)))
            return True
        except TimeoutException:
            return False

    first = f"room-1 message A ({run_id})"
    if publish(first, "/publish?topic=room-1"):
        checks.check("topic-message-shown", wait_shown(first, 15), f"{first!r} not in #messages after 15 s")

    # One to `feed` (no topic parameter), then one to room-1: once the later one shows,
    # the earlier one would have too (one LISTEN connection, in commit order).
    other = f"feed message B ({run_id})"
    later = f"room-1 message C ({run_id})"
    if publish(other, "/publish") and publish(later, "/publish?topic=room-1"):
        shown_later = wait_shown(later, 15)
        items = message_texts(driver)
        leaked = any(other in item for item in items)
        checks.check("topic-isolation: no message of another topic on the page", shown_later and not leaked,
                     f"{later!r} not shown after 15 s" if not shown_later
                     else f"{other!r}, published to feed, shows on the page on room-1")

    typed = f"typed on room-1 ({run_id})"
    field = driver.find_element(By.ID, "publish-text")
    field.clear()
    field.send_keys(typed)
    driver.find_element(By.ID, "publish-button").click()
    checks.check("topic-publish-from-page", wait_shown(typed, 15),
                 f"{typed!r} not shown on room-1 ({text_of(driver, 'publish-result')!r})")

    # The page's URL names the topic.
    url = f"http://{args.server}/?topic=room-2"
    driver.get(url)
    try:
        WebDriverWait(driver, min(left(), 15)).until(lambda d: on_topic("room-2"))
        third = f"room-2 message D ({run_id})"
        shown = publish(third, "/publish?topic=room-2") and wait_shown(third, 15)
        value = driver.find_element(By.ID, "topic").get_attribute("value")
        checks.check("topic-from-url", shown and value == "room-2",
                     f"#topic reads {value!r}" if shown else f"{third!r} not shown")
    except TimeoutException:
        checks.check("topic-from-url", False, f"{url}: #current-topic {text_of(driver, 'current-topic')!r}, "
                     f"#status {text_of(driver, 'status')!r}")


def check_reconnect(driver: webdriver.Chrome, args: argparse.Namespace, checks: Checks, left) -> None:
    run_id = uuid.uuid4().hex[:6]
    topic = f"recon-{run_id}"
    path = f"/publish?topic={topic}"
    driver.get(f"http://{args.server}/?topic={topic}")

    def wait(condition, seconds: float) -> bool:
        try:
            WebDriverWait(driver, min(left(), seconds)).until(lambda d: condition())
            return True
        except TimeoutException:
            return False

    def shown(text: str) -> bool:
        return any(text in item for item in message_texts(driver))

    def state() -> str:
        return (f"#status {text_of(driver, 'status')!r}, #recovery "
                f"{text_of(driver, 'recovery') if driver.find_elements(By.ID, 'recovery') else 'missing'!r}")

    first = f"before the drop ({run_id})"
    if not wait(lambda: text_of(driver, "status") == "ready", 15) or post_publish(args.server, first, 10, path) != 200 \
            or not wait(lambda: shown(first), 15):
        checks.check("reconnect: the page on its own topic", False, f"{first!r} not shown; {state()}")
        return
    # The connection drops (closed under the page, which reconnects on its own after about 0.5 s);
    # meanwhile two messages are published, which only a reconnect with since can bring.
    driver.execute_script("socket.close();")
    missed = [f"missed {i} ({run_id})" for i in (1, 2)]
    statuses = [post_publish(args.server, text, 10, path) for text in missed]
    ok = wait(lambda: text_of(driver, "status") == "recovered" and all(shown(t) for t in missed), 15)
    items = message_texts(driver)
    positions = [next((i for i, item in enumerate(items) if t in item), None) for t in list(reversed(missed)) + [first]]
    in_order = None not in positions and positions == sorted(positions)
    recovery = text_of(driver, "recovery") if driver.find_elements(By.ID, "recovery") else ""
    checks.check("reconnect-recovered: after a dropped connection the page comes back with since and epoch, "
                 "shows the 2 messages it missed, in order, and `recovered`",
                 statuses == [200, 200] and ok and in_order and "recovered 2" in recovery,
                 f"publishes {statuses}; {state()}; shown {[t for t in missed if shown(t)]}; positions {positions}")
    # Away for longer than the topic lives without a client: it restarts with another epoch.
    try:
        network = {"latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, **network})
        driver.execute_script("socket.close();")
        time.sleep(6.5)
        driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": False, **network})
    except WebDriverException as error:
        checks.check("reconnect-resync: DevTools' request blocking", False, error.msg)
        return
    # The page's backoff grows while blocked (0.5, 1, 2, 4, 8 s): the next try is within 10 s.
    ok = wait(lambda: text_of(driver, "status") == "resync", 20)
    recovery = text_of(driver, "recovery") if driver.find_elements(By.ID, "recovery") else ""
    checks.check("reconnect-resync: a page that comes back to a topic that restarted shows `resync` and the reason",
                 ok and recovery.startswith("resync:") and "epoch" in recovery, state())
    after = f"after the resync ({run_id})"
    status = post_publish(args.server, after, 10, path)
    checks.check("reconnect-resync: the page goes on with the next message", status == 200 and wait(lambda: shown(after), 15),
                 f"publish {status}; {after!r} not shown; {state()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="127.0.0.1:8080", help="HOST:PORT of a feed server")
    parser.add_argument("--screenshot", default="", help="where to save a PNG of the page")
    parser.add_argument("--timeout", type=float, default=60, help="seconds for the whole run")
    args = parser.parse_args()

    checks = Checks()

    timer = checks.start_watchdog(args.timeout + 30)
    try:
        run(args, checks)
    except Exception as error:  # noqa: BLE001 - reported as a failed check
        message = error.msg if isinstance(error, WebDriverException) else str(error)
        checks.check("finished", False, f"{type(error).__name__}: {message}")
    timer.cancel()
    print(checks.summary(), flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())

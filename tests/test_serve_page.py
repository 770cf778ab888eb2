"""The web page at / in a real browser: Playwright (PyPI) driving Debian's chromium against a real
`memagent serve` process with the model-free instant backend.

scripts/setup.sh installs chromium (apt, as root) and playwright (requirements.txt); these tests skip,
saying why, only where the browser cannot be had. MEMAGENT_SCREENSHOT=PATH saves a screenshot of the
finished reading (how docs/serve.png was made).
"""
import json
import os
import statistics
from pathlib import Path

import pytest

from servers import ServerProcess

CHROMIUM = Path(os.environ.get("MEMAGENT_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
DOC = "\n".join(f"Log line {i}: the keeper checked lamp {i % 7} and wrote the weather down." for i in range(160))
expect = None  # playwright.sync_api.expect, imported by the browser fixture (playwright may be missing)
XSS = '<script>window.__xss = 1; alert(1)</script><img src=x onerror="window.__xss = 2; alert(2)">'


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"no chromium at {CHROMIUM}: scripts/setup.sh installs it as root (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (scripts/setup.sh installs requirements.txt)")
    global expect
    from playwright.sync_api import expect
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server():
    # a small delay per call, so that a read takes a visible while and events arrive one by one
    with ServerProcess("--backend", "instant", "--instant-delay", "0.02", "--chunk-tokens", "64") as s:
        yield s


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    context.close()


def read(page, server, doc: str, questions: list[str]):
    page.goto(server.root_url + "/")
    expect(page.locator("#template option").first).to_be_attached()
    page.fill("#doc", doc)
    page.fill("#questions", "\n".join(questions))
    page.click("#start")
    page.wait_for_selector(f"#answers .answer-item >> nth={len(questions) - 1}", timeout=60_000)


def test_page_reads_live_and_scrubs_the_memory(page, server, tmp_path):
    read(page, server, DOC, ["Which lamp was checked last?", "What was written down?"])
    n_chunks = page.locator("#chunk-log li").count()
    assert n_chunks >= 10  # ~2,700 tokens at 64 per chunk
    events = page.evaluate("window.memagent.events")
    chunks = [e for e in events if e["type"] == "chunk"]
    assert len(chunks) == n_chunks and [e["type"] for e in events][-2:] == ["done", "end"]
    # live, not at the end: chunk events arrived spread over the read, each soon after the server sent it
    lag = [e["received"] - e["sent"] for e in chunks]
    assert statistics.median(lag) < 100, lag
    assert chunks[-1]["received"] - chunks[0]["received"] > 100
    answers = page.locator("#answers .answer-item .a").all_text_contents()
    assert answers == ["instant", "instant"]  # the instant backend's fixed answer
    assert "Done" in page.text_content("#status")

    # the timeline of question 2: one point per chunk; scrubbing to chunk 1 shows that chunk's memory
    panel = page.locator(".panel").nth(1)
    slider = panel.locator(".timeline")
    assert int(slider.get_attribute("max")) == n_chunks - 1
    last_memory = panel.locator(".memory").text_content()
    slider.evaluate("(s) => { s.value = 0; s.dispatchEvent(new Event('input')); }")
    assert panel.locator(".step").text_content().startswith("Chunk 1: updated")
    first_memory = panel.locator(".memory").text_content()
    assert first_memory and first_memory != last_memory
    assert panel.locator(".diff ins").count() >= 1  # what changed, marked
    panel.locator(".chunk-details summary").click()
    expect(panel.locator(".chunk-text")).to_contain_text("Log line 0:")

    with page.expect_download() as download:
        page.click("#download-trace")
    lines = Path(download.value.path()).read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    assert steps.count("update") == 2 * n_chunks and steps.count("final") == 2
    assert not page.errors and not page.dialogs
    shot = os.environ.get("MEMAGENT_SCREENSHOT")
    if shot:
        slider.evaluate("(s) => { s.value = 3; s.dispatchEvent(new Event('input')); }")
        page.screenshot(path=shot, full_page=True)


def test_page_shows_markup_as_text_and_runs_none_of_it(page, server):
    doc = f"Intro.\n{XSS}\n" + DOC
    question = f"What does {XSS} do?"
    read(page, server, doc, [question])
    assert page.evaluate("window.__xss") is None
    assert page.dialogs == [] and page.errors == []
    assert page.locator("img").count() == 0 and page.locator("#panels script, #answers script").count() == 0
    assert XSS in page.locator(".panel .question").text_content()  # shown, as text
    assert XSS in page.locator("#answers .q").text_content()
    panel = page.locator(".panel").first
    panel.locator(".timeline").evaluate("(s) => { s.value = 0; s.dispatchEvent(new Event('input')); }")
    panel.locator(".chunk-details summary").click()
    expect(panel.locator(".chunk-text")).to_contain_text("onerror")
    assert XSS in panel.locator(".chunk-text").text_content()
    assert page.evaluate("window.__xss") is None and page.dialogs == []


def test_page_with_api_key(browser):
    with ServerProcess("--backend", "instant", "--api-key", "sk-page") as s:
        context = browser.new_context()
        page = context.new_page()
        page.goto(s.root_url + "/")  # the page itself needs no key; its API calls do
        expect(page.locator("#error")).to_contain_text("API key")
        page.fill("#api-key", "sk-page")
        page.dispatch_event("#api-key", "change")
        expect(page.locator("#template option").first).to_be_attached()
        page.fill("#doc", "A short note: the code is 12.")
        page.fill("#questions", "What is the code?")
        page.click("#start")
        page.wait_for_selector("#answers .answer-item", timeout=30_000)
        context.close()


def read_with_settings(page, server, doc: str, question: str, settings) -> None:
    """One question read from the page after `settings(page)` has changed its settings panel."""
    page.goto(server.root_url + "/")
    expect(page.locator("#template option").first).to_be_attached()
    page.fill("#doc", doc)
    page.fill("#questions", question)
    page.locator("details").first.click()  # the settings
    settings(page)
    page.click("#start")
    page.wait_for_selector("#answers .answer-item", timeout=60_000)


def test_page_sends_chunk_snap_and_shows_the_servers_default(page, server):
    def settings(page):
        assert page.locator("#chunk-snap").input_value() == "0"  # the server's default: token-exact
        page.fill("#chunk-snap", "30")

    read_with_settings(page, server, DOC, "Which lamp was checked last?", settings)
    job = page.evaluate("fetch('/api/jobs').then((r) => r.json())")["jobs"]
    job = max(job, key=lambda j: j["created"])
    assert job["settings"]["chunk_snap"] == 30
    ends = [e["end_char"] for e in _chunk_events(page, job["id"])]
    assert ends[-1] == len(DOC) and all(DOC[e - 1] == "\n" for e in ends[:-1])


def _chunk_events(page, job_id: str) -> list[dict]:
    raw = page.evaluate(f"fetch('/api/jobs/{job_id}/events').then((r) => r.text())")
    return [json.loads(line[6:]) for line in raw.splitlines()
            if line.startswith("data: ") and '"chunk"' in line and '"end_char"' in line]


def test_page_lists_the_chunks_the_skip_gate_passed(page, server):
    doc = DOC + "\nZebediah Crane rowed out with the mail on the last day.\n" + DOC
    read_with_settings(page, server, doc, "Who is Zebediah Crane?",
                       lambda page: page.select_option("#skip-update", "lexical"))
    skipped = page.locator("#chunk-log li.skip").count()
    assert skipped >= 20 and page.locator("#chunk-log li").count() > skipped  # most skipped, not all
    assert page.locator(".panel .skipped").text_content().startswith("Skipped chunks (no call): 1, 2, 3")
    slider = page.locator(".panel .timeline")
    slider.evaluate("(s) => { s.value = 0; s.dispatchEvent(new Event('input')); }")
    assert "skipped by the gate" in page.locator(".panel .step").text_content()

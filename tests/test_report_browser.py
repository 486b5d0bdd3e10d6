"""The run report in a real browser: a real 2-round run's report.html, rendered by headless Chromium, logs
no console error and throws no page error, requests nothing outside the file, resolves every in-page link
(each cited evidence rollout `#r-<id>`, each mark of the pictures) to an element, and does not paint a blank
page. A doctored copy of the same report, one planted fault at a time, shows that each check fails when its
fault is there. The pictures show the run: every branch a mark of the lineage, no two of its labels overlapping
(at 30 rounds too, and 20 fit the page), a chart per step metric the store holds, a row per verdict and A-A pair,
and a finding's evidence rollouts' text opens in place."""

from __future__ import annotations

import base64
import io
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright
from rich.console import Console

from conftest import small_config
from evotrainer.backtest.verdict import read_verdicts
from evotrainer.loop import run_loop
from evotrainer.report.curves import METRICS
from evotrainer.report.html import CSS
from evotrainer.report.lineage import RoundShape, lineage_svg
from evotrainer.stages.results import stage_results
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore

# This machine has no internet: Debian's chromium, never Playwright's own downloads, and nothing that
# phones home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}
# Blank: one colour covers at least this share of the first screen. The real report's first screen (title,
# summary, budget table, lineage) leaves several percent of its pixels off the background (printed by the test).
BLANK_SHARE = 0.995
# In-page links whose fragment names no element (`#` alone counts as broken: it names nothing).
BROKEN_LINKS_JS = """() => [...document.querySelectorAll('a[href^="#"]')]
    .map(a => a.getAttribute('href'))
    .filter(h => { const id = decodeURIComponent(h.slice(1));
                   return !id || (!document.getElementById(id) && !document.getElementsByName(id).length); })"""
# The share of the most common colour in a PNG (a data URL), decoded by the browser itself.
DOMINANT_SHARE_JS = """async (url) => {
    const img = new Image(); img.src = url; await img.decode();
    const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
    const g = c.getContext('2d'); g.drawImage(img, 0, 0);
    const px = new Uint32Array(g.getImageData(0, 0, c.width, c.height).data.buffer);
    const counts = new Map(); let top = 0;
    for (const p of px) { const n = (counts.get(p) || 0) + 1; counts.set(p, n); if (n > top) top = n; }
    return top / px.length; }"""


def chromium_path() -> str:
    """Debian's chromium. Skips only where there is none and none could be installed here; where
    scripts/setup.sh installs it (root with apt-get), a missing browser is a broken set-up and fails."""
    path = shutil.which("chromium") or next((p for p in ["/usr/bin/chromium"] if os.access(p, os.X_OK)), None)
    if path:
        return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        pytest.fail(
            "chromium is not installed, yet this machine runs as root with apt-get, where `scripts/setup.sh dev` "
            "installs it (apt-get install chromium)"
        )
    pytest.skip("no chromium binary, and apt-get is not usable here (needs root): install Debian's chromium")


@dataclass
class Rendered:
    """What the browser saw of one page."""

    errors: list[str] = field(default_factory=list)  # console errors and uncaught page errors
    requests: list[str] = field(default_factory=list)  # anything fetched from outside the file (aborted)
    broken_links: list[str] = field(default_factory=list)
    links: int = 0
    dominant_share: float = 1.0
    seconds: float = 0.0

    def problems(self) -> list[str]:
        out = [f"console or page error: {e}" for e in self.errors]
        out += [f"request outside the file: {u}" for u in self.requests]
        out += [f"link to no element: {h}" for h in self.broken_links]
        if self.dominant_share >= BLANK_SHARE:
            out.append(f"blank screenshot: one colour covers {self.dominant_share:.1%} of it")
        return out


def render(browser: Browser, path: Path) -> Rendered:
    """Open `path` in a fresh page, let it settle, and run every check."""
    seen = Rendered()
    t0 = time.monotonic()
    page = browser.new_page(viewport=VIEWPORT)
    try:
        page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: seen.errors.append(f"uncaught: {e}"))
        url = path.resolve().as_uri()

        def outside(route) -> None:
            seen.requests.append(route.request.url)
            route.abort()

        page.route(lambda u: u != url, outside)
        page.goto(url, wait_until="load")
        page.wait_for_timeout(200)  # late scripts and their errors
        seen.links = page.eval_on_selector_all('a[href^="#"]', "as => as.length")
        seen.broken_links = page.evaluate(BROKEN_LINKS_JS)
        shot = page.screenshot(type="png")
        seen.seconds = time.monotonic() - t0
    finally:
        page.close()
    decoder = browser.new_page()
    try:
        seen.dominant_share = decoder.evaluate(
            DOMINANT_SHARE_JS, "data:image/png;base64," + base64.b64encode(shot).decode()
        )
    finally:
        decoder.close()
    return seen


@pytest.fixture(scope="module")
def browser():
    exe = chromium_path()
    t0 = time.monotonic()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        print(f"\nchromium {b.version} launched in {time.monotonic() - t0:.2f} s")
        yield b
        b.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory, math_setup) -> Path:
    """A real run's report: the 2-round loop on the tiny model, as test_loop.py's `loop_config` makes it, with
    completions cut at 4 tokens (examples/failures/truncation.yaml) so that its rounds have findings with
    evidence."""
    tmp = tmp_path_factory.mktemp("browser")
    loop = {"segment_steps": 3, "trial_steps": 4, "candidates": 2, "max_rounds": 2, "max_trial_share": 1.0}
    sampling = {"num_generations": 8, "prompts_per_step": 16, "max_completion_length": 4}
    cfg = small_config(tmp, loop={**loop, "skills_dir": str(tmp / "skills")}, harness={"sampling": sampling})
    t0 = time.monotonic()
    run_loop(cfg, Console(file=io.StringIO(), width=200))
    print(f"\nthe 2-round run took {time.monotonic() - t0:.1f} s")
    return tmp / "runs" / "t" / "report.html"


def test_the_report_renders_cleanly(browser, report):
    seen = render(browser, report)
    print(
        f"report.html ({report.stat().st_size / 1024:.0f} KiB) rendered and checked in {seen.seconds:.2f} s: "
        f"{seen.links} in-page links, top colour {seen.dominant_share:.1%} of the first screen"
    )
    assert seen.problems() == []
    html = report.read_text()
    # Every cited rollout the page links to is on the page, and the browser follows a link to it.
    assert seen.links == html.count('href="#')
    if seen.links:
        page = browser.new_page()
        try:
            page.goto(report.resolve().as_uri())
            first = page.locator('a[href^="#"]').first
            target = first.get_attribute("href")
            first.click()
            assert page.evaluate("() => location.hash") == target
            assert page.evaluate("() => document.querySelector(':target')?.id") == target[1:]
        finally:
            page.close()


PLANTED = {
    "console error": ("<script>console.error(1)</script>", "console or page error"),
    "uncaught error": ("<script>throw new Error('planted')</script>", "console or page error: uncaught"),
    "broken link": ('<a href="#r-no-such-rollout">gone</a>', "link to no element: #r-no-such-rollout"),
    "empty link": ('<a href="#">nowhere</a>', "link to no element: #"),
    "blank page": ("<style>body{visibility:hidden}</style>", "blank screenshot"),
    "external asset": ('<img src="http://example.invalid/x.png">', "request outside the file"),
}


def test_each_check_fails_on_its_planted_fault(browser, report, tmp_path):
    html = report.read_text()
    assert "</h1>" in html
    clean = tmp_path / "clean.html"
    clean.write_text(html)
    assert render(browser, clean).problems() == []  # the copy itself is fine: what fails below is the plant
    for name, (plant, expected) in PLANTED.items():
        doctored = tmp_path / f"{name.replace(' ', '-')}.html"
        doctored.write_text(html.replace("</h1>", "</h1>" + plant, 1))
        seen = render(browser, doctored)
        print(f"planted {name}: caught in {seen.seconds:.2f} s: {seen.problems()}")
        assert any(p.startswith(expected) for p in seen.problems()), (name, seen.problems())


# What the pictures hold, read from the page the browser laid out.
PICTURES_JS = """() => {
    const lin = document.querySelector('.lineage svg');
    const box = r => [r.left, r.top, r.right, r.bottom];
    return {
        branches: [...lin.querySelectorAll('circle > title')].map(t => t.textContent.split(' ')[0]),
        labels: [...lin.querySelectorAll('text')].map(t => [t.textContent, box(t.getBoundingClientRect())]),
        charts: [...document.querySelectorAll('.charts svg')].map(s => [s.getAttribute('aria-label'),
                  [...s.querySelectorAll('polyline')].map(p => p.points.numberOfItems),
                  s.querySelectorAll('circle').length]),
        effects: [...document.querySelectorAll('.effects g > title')].map(t => t.textContent),
    }; }"""


def overlapping(labels: list) -> list[tuple[str, str]]:
    """Pairs of text labels whose boxes overlap by more than a pixel each way."""
    out = []
    for i, (a, (l1, t1, r1, b1)) in enumerate(labels):
        for b, (l2, t2, r2, b2) in labels[i + 1 :]:
            if min(r1, r2) - max(l1, l2) > 1 and min(b1, b2) - max(t1, t2) > 1:
                out.append((a, b))
    return out


def test_the_pictures_show_the_run(browser, report):
    run = report.parent
    ledger = Ledger(run / "ledger.sqlite")
    branches = [b["id"] for b in ledger.branches()]
    verdicts = read_verdicts(ledger)
    gates = [
        r
        for (_, st), r in stage_results(ledger.rows("SELECT round, stage, result FROM stages")).items()
        if st == "gate"
    ]
    ledger.close()
    store = RolloutStore(run / "store")
    recorded = {r["name"] for r in store.sql("SELECT DISTINCT name FROM metrics WHERE isfinite(value)")}
    page = browser.new_page(viewport=VIEWPORT)
    try:
        page.goto(report.resolve().as_uri())
        seen = page.evaluate(PICTURES_JS)
        assert sorted(seen["branches"]) == sorted(branches)
        assert overlapping(seen["labels"]) == []
        # A chart per metric the store holds (finite somewhere), its lines drawn; held-out accuracy as dots.
        labels = [c[0] for c in seen["charts"]]
        assert labels[0] == "held-out accuracy per branch" and seen["charts"][0][2] > 0
        assert labels[1:] == [f"{m} per branch by step" for m in METRICS if m in recorded]
        assert all(max(c[1]) >= 2 for c in seen["charts"][1:]), seen["charts"]
        pairs = [p for g in gates[-1:] for p in g.noise.pairs]
        assert len(seen["effects"]) == len(verdicts) + len(pairs) > 0
        assert [e.split(" ")[0] for e in seen["effects"][len(pairs) :]] == [v.trial for v in verdicts]
        # A finding's evidence opens in place: hidden until its summary is clicked, then the stored text.
        details = page.locator("#rounds ~ table details").first
        shown = details.locator(".ev pre").first
        assert not shown.is_visible()
        details.locator("summary").click()
        assert shown.is_visible()
        rid = details.locator(".ev code").first.inner_text()
        (stored,) = store.query(f"id = '{rid}'")
        assert shown.inner_text().startswith(stored["prompt"].strip())
        assert stored["turns"][0]["action"].strip() in shown.inner_text()
    finally:
        page.close()


def long_lineage(rounds: int) -> list[RoundShape]:
    """A made-up run of `rounds` rounds: four arms each, a promotion every fifth round, a rollback every seventh."""

    def branch(rnd: int, name: str, kind: str, parent: str, acc: float | None) -> dict:
        return {
            "id": f"r{rnd:02d}-{name}",
            "parent": parent,
            "round": rnd,
            "kind": kind,
            "harness_version": "h-1",
            "suite_version": "s-1",
            "first_step": 10 * rnd,
            "last_step": 10 * rnd + 9,
            "heldout_accuracy": acc,
        }

    out, head = [], "base"
    for r in range(1, rounds + 1):
        seg = branch(r, "seg", "segment", head, None)
        arms = [
            branch(r, n, k, seg["id"], 0.5 + r / 100)
            for n, k in [("c1", "candidate"), ("c2", "candidate"), ("ctl", "control"), ("c1r", "replicate")]
        ]
        shape = RoundShape(r, seg, arms)
        if r % 7 == 0:
            shape.head = shape.rolled_back_to = head
        else:
            shape.head = arms[0]["id"] if r % 5 == 0 else arms[2]["id"]
            shape.promoted = shape.head if r % 5 == 0 else None
            head = shape.head
        out.append(shape)
    return out


@pytest.mark.parametrize("rounds", [20, 30])
def test_a_long_lineage_stays_readable(browser, tmp_path, rounds):
    base = {
        "id": "base",
        "parent": None,
        "round": 0,
        "kind": "base",
        "harness_version": "h-0",
        "suite_version": "s-0",
        "first_step": 0,
        "last_step": 0,
        "heldout_accuracy": None,
    }
    shapes = long_lineage(rounds)
    page_file = tmp_path / "lineage.html"
    page_file.write_text(
        f"<!doctype html><meta charset=utf-8><style>{CSS}</style><div id=lineage class=lineage>"
        + lineage_svg(shapes, base, {})
        + "</div>"
        + "".join(f'<p id="round-{r}">' for r in range(1, rounds + 1))
    )
    seen = render(browser, page_file)
    assert seen.problems() == []
    page = browser.new_page(viewport=VIEWPORT)
    try:
        page.goto(page_file.resolve().as_uri())
        got = page.evaluate(PICTURES_JS)
        assert len(got["branches"]) == 1 + 5 * rounds
        assert overlapping(got["labels"]) == []
        fits = page.evaluate(
            "() => { const d = document.querySelector('.lineage'); return [d.scrollWidth, d.clientWidth]; }"
        )
        height = page.evaluate("() => document.querySelector('.lineage svg').getBoundingClientRect().height")
    finally:
        page.close()
    assert height < 200  # a column a round, not a step a branch: the height does not grow with the rounds
    if rounds <= 20:
        assert fits[0] <= fits[1], fits  # no horizontal scroll at 20 rounds on a 1280-pixel screen

"""bench report --html: one self-contained page (verdict, tables, inline plots, flags,
machines, commands) that opens offline in a real browser at a desk's and a phone's width,
and never turns what a record says into markup."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from conftest import ROOT, run_bench
from report_records import record, write_runs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Injected into a copy of the page only (the page itself has no script): what the browser
# found, written into the DOM for --dump-dom to show. Errors are caught from the first
# element on, resource errors included (capture phase).
_PROBE = """<script>
const seen = [];
window.addEventListener('error',
  e => seen.push(String(e.message || e.target && e.target.outerHTML)), true);
window.addEventListener('load', () => {
  const root = document.documentElement, images = [...document.images];
  const found = JSON.stringify({
    errors: seen, width: root.scrollWidth, viewport: window.innerWidth,
    svgs: document.querySelectorAll('figure svg').length,
    drawn: [...document.querySelectorAll('figure svg')]
      .every(s => s.getBoundingClientRect().width > 100),
    images: images.length, loaded: images.every(i => i.complete && i.naturalWidth > 0),
    verdict: document.body.innerText.includes('is fastest'),
    tables: document.querySelectorAll('table').length});
  document.body.setAttribute('data-check', found);
  if (window.parent !== window) window.parent.postMessage(found, '*');
});
</script>"""
# Headless Chromium keeps its window at least 500 px wide: a phone's 390 px is a frame of
# that width in a host page, which writes down what the framed page reported.
_HOST = """<!DOCTYPE html><html><body style="margin:0">
<iframe src="{page}" style="border:0;width:{width}px;height:900px"></iframe>
<script>window.addEventListener('message', e => document.body.setAttribute('data-check', e.data));
</script></body></html>"""


def _page(tmp_path, results=ROOT / "results"):
    page = tmp_path / "report.html"
    proc = run_bench("report", "--results", str(results), "--no-write", "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    # the committed results' 40 figures, all drawn before the page showed one, made
    # matplotlib warn; one workload at a time, nothing does
    assert "Warning" not in proc.stderr, proc.stderr
    return page, proc


def test_the_page_is_self_contained_and_escapes_what_records_say(tmp_path):
    hostile = record("x", "<img src=x onerror=alert(1)>", 2, [3.0, 1.0], [0.1, 0.5])
    hostile["command"] = ["bench", "run", "</code><script>alert(2)</script>"]
    hostile["env"] = {**hostile["env"], "tuning": {"OMP_WAIT_POLICY": "<b>",
                                                   "OMP_X;touch pwned;": "1"}}
    results = write_runs(tmp_path / "results", [record("a", "ddp", 1, [3.0, 2.0], [0.1, 0.5]),
                                                 record("b", "ddp", 2, [3.0, 1.0], [0.1, 0.5]),
                                                 hostile])
    page, _ = _page(tmp_path, results)
    text = page.read_text()
    assert "<script" not in text.lower() and "<img" not in text.lower(), "markup from a record"
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "&lt;/code&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in text
    # each run's command under the variables its shell set that change speed (env.tuning):
    # a shell line (NAME='value', as a shell assigns it): the run as it ran, escaped as any
    # string from a record
    assert "<code>OMP_WAIT_POLICY=&#x27;&lt;b&gt;&#x27; bench run " in text, text
    assert "pwned" not in text  # a name a shell reads as a command too is no variable
    # nothing fetched from anywhere: every href is a fragment inside an inline SVG
    assert not re.findall(r'(?:src|href)="(?!#)', text), re.findall(r'(?:src|href)="[^"]*"', text)
    assert "url(http" not in text and "@import" not in text


def test_the_answer_names_a_block_it_has_nothing_to_say_about(tmp_path):
    """A workload with one configuration has no verdict; the answer box says so rather than
    leaving it out without a word."""
    lone = record("c", "ddp", 1, [3.0, 2.0], [0.1, 0.5])
    lone["env"] = {**lone["env"], "cpu": "Other CPU"}  # another machine: a block of its own
    results = write_runs(tmp_path / "results", [record("a", "ddp", 1, [3.0, 2.0], [0.1, 0.5]),
                                                 record("b", "ddp", 2, [3.0, 1.0], [0.1, 0.5]),
                                                 lone])
    text = _page(tmp_path, results)[0].read_text()
    box = text.split('<div class="answer">')[1].split("</div>")[0]
    assert ("on Test (2 cores)</b>: One configuration, ddp, at N=1 and N=2: no other to race "
            "at the same N; its speed-up and scaling efficiency say what more ranks gain. "
            "Top-1 against ddp N=1") in box, box
    lone_line = "on Other (2 cores)</b>: one configuration, nothing here to compare it with."
    assert lone_line + "</li>" in box, box


def test_a_command_the_verdict_names_is_code_on_the_page(tmp_path):
    """The terminal keeps a `quoted command` whole on a line; the page showed its backticks.
    A block without its reference row names the --reference that would compare it."""
    results = write_runs(tmp_path / "results", [record("a", "ddp", 2, [3.0, 2.0], [0.1, 0.5]),
                                                 record("b", "fsdp", 2, [3.0, 1.0], [0.1, 0.5])])
    text = _page(tmp_path, results)[0].read_text()
    command = "(<code>bench report --reference ddp:2</code> compares with that row instead)"
    box = text.split('<div class="answer">')[1].split("</div>")[0]
    assert command in box and command in text.split("</div>", 1)[1], text
    assert "`" not in text


def test_the_html_file_is_checked_before_anything_is_read(tmp_path):
    proc = run_bench("report", "--results", str(ROOT / "results"), "--no-write", "--html",
                     str(tmp_path / "report.txt"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "must end in .html" in proc.stderr and proc.stdout == ""


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; "
                    ".ci/run installs it)")
def test_the_committed_report_opens_in_a_browser_at_desk_and_phone_widths(tmp_path):
    page, _ = _page(tmp_path)
    text = page.read_text()
    figures = text.count("<figure>")
    assert figures >= 10 and "The answer" in text
    # a cell with no figure says '—': the projection's N=1 rows read 'nan' (pandas holds a
    # column's None as NaN)
    assert ">nan<" not in text.lower(), re.findall(r".{200}>nan<", text, re.I)
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("<head>", "<head>" + _PROBE, 1))
    host = tmp_path / "phone.html"
    host.write_text(_HOST.format(page=probed.name, width=390))
    for width, opened in ((1280, probed), (390, host)):
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--window-size=1280,900", "--virtual-time-budget=10000", "--dump-dom",
             opened.as_uri()], capture_output=True, text=True, timeout=120)
        found = re.search(r"data-check=\"([^\"]*)\"", proc.stdout)
        assert found, (proc.returncode, proc.stderr[-3000:])
        check = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
        assert check["errors"] == [], check
        assert "Failed to load resource" not in proc.stderr
        # the page never scrolls sideways: wide tables scroll inside their own box
        assert check["width"] <= check["viewport"] == width, check
        assert check["svgs"] == figures and check["drawn"], check
        assert check["loaded"] and check["verdict"] and check["tables"] >= 4, check


def test_a_page_where_nothing_compares_still_answers_its_question(tmp_path):
    """The page asks 'Which data-parallel strategy is fastest here, and does it cost
    accuracy?'; a folder of one finished run and one interrupted left it without an answer
    box at all, as if the report had nothing to say."""
    stopped = {**record("b", "fsdp", 2, [3.0, 2.0], [0.1, 0.5]), "status": "interrupted",
               "error": "Ctrl-C (SIGINT)", "train_size": 2000}
    results = write_runs(tmp_path / "results",
                         [record("a", "ddp", 2, [3.0, 2.0], [0.1, 0.5]), stopped])
    text = _page(tmp_path, results)[0].read_text()
    box = text.split('<div class="answer">')[1].split("</div>")[0]
    assert "Not answered yet: a workload needs two finished configurations" in box, box
    assert "<code>bench sweep</code>" in box
    assert "(2 cores)</b>: one configuration, nothing here to compare it with.</li>" in box, box
    assert "(2 cores)</b>: no run here finished (its table says how each ended).</li>" in box

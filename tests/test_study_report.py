"""The study's report.html, opened in a real headless Chromium, and runs.csv, read by pandas:
what a researcher opens must show the same numbers as study.json."""

from __future__ import annotations

import json
import shutil

import pytest
from test_study_figures import study_runs

from study import report
from study.claims import CLAIMS, judge, number

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def written(tmp_path):
    runs = study_runs()
    report.write(tmp_path, judge(CLAIMS, runs), runs, {"engine": "test", "seeds": [1, 2, 3]})
    return tmp_path, runs


def test_runs_csv_has_one_row_per_run_with_every_figure(written):
    pandas = pytest.importorskip("pandas")
    folder, runs = written
    frame = pandas.read_csv(folder / "runs.csv")
    assert len(frame) == sum(len(rs) for rs in runs.values()) == 6
    by_run = frame.set_index(["variant", "seed"])
    for variant, variant_runs in runs.items():
        for run in variant_runs:
            row = by_run.loc[(variant, run.seed)]
            for key, value in run.metrics().items():
                if value is None:
                    assert pandas.isna(row[key]), key
                elif isinstance(value, bool):
                    assert bool(row[key]) is value, key
                else:
                    assert row[key] == pytest.approx(value), key


@pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER), reason="Chromium and chromedriver not installed (make setup)"
)
def test_report_html_renders_in_chromium_with_its_images_and_study_json_numbers(written):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    folder, _ = written
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get((folder / "report.html").as_uri())
        assert driver.title == "forgive study note"
        images = driver.execute_script(
            "return [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
        )
        assert len(images) == 3 and all(ok and w > 100 and h > 100 for ok, w, h in images)
        rows = driver.execute_script(
            "return [...document.querySelectorAll('tbody tr')].map(r => "
            "[r.dataset.key, r.dataset.value, [...r.cells].map(c => c.innerText)])"
        )
    finally:
        driver.quit()
    claims = json.loads((folder / "study.json").read_text())["claims"]
    assert [key for key, _, _ in rows] == [c["key"] for c in claims]
    for (_, value, cells), claim in zip(rows, claims, strict=True):
        assert json.loads(value) == claim["median"]
        shown = "-" if claim["median"] is None else number(claim["median"])
        assert cells[4] == shown, claim["key"]
        assert cells[5] in ("yes", "NO", "-", "n/a")
    forgive = next(cells for key, _, cells in rows if key == "time.forgive")
    assert forgive[5:] == ["yes", "yes"]

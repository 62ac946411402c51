"""The study's report.html, opened in a real headless Chromium, and runs.csv, read by pandas:
what a researcher opens must show the same numbers as study.json."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from test_study_figures import study_runs

from runplan.fabric import PRESETS, sim_scaling
from runplan.run import JOBS, RunConfig
from runs.csvfile import DURATIONS, SAME_AS
from study import report
from study.claims import CLAIMS, judge, number

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


META = {
    "engine": "sim",
    "worst_fabric": "note-4to1",
    "byte_scale": 128.0,
    "steps": 2,
    "critical_steps": [1, 2],
    "seeds": [1, 2, 3],
    "cells_left_out": [],
    "wall_time_s": 33.755441544999485,
    "nic": {"window": "none"},
    "runs_made": 6,
}
"""A study as a new user ran it: bytes / 128 over two steps, every step critical."""


def labelled(runs):
    config = RunConfig(
        sim_scaling(PRESETS["note-4to1"], byte_scale=128), workload=replace(JOBS["note"], steps=2),
        engine="sim",
    )  # fmt: skip
    return [
        (variant, replace(config, policy=variant, seed=r.seed), r)
        for variant, variant_runs in runs.items()
        for r in variant_runs
    ]


@pytest.fixture
def written(tmp_path):
    runs = study_runs()
    report.write(tmp_path, judge(CLAIMS, runs), runs, META, labelled(runs))
    return tmp_path, runs


def test_runs_csv_has_one_row_per_run_with_every_figure(written):
    pandas = pytest.importorskip("pandas")
    folder, runs = written
    frame = pandas.read_csv(folder / "runs.csv")
    assert len(frame) == sum(len(rs) for rs in runs.values()) == 6
    assert set(frame["engine"]) == {"sim"} and set(frame["byte_scale"]) == {128}
    assert set(frame["steps"]) == {2} and set(frame["fabric"]) == {"f"}
    by_run = frame.set_index(["variant", "seed"])
    for variant, variant_runs in runs.items():
        for run in variant_runs:
            row = by_run.loc[(variant, run.seed)]
            for key, value in run.metrics().items():
                if key in DURATIONS:
                    stem, to_ms = DURATIONS[key]
                    key, value = f"{stem}_run_ms", None if value is None else value * to_ms
                    fabric = row.get(f"{stem}_fabric_ms")
                    if value is None:
                        assert fabric is None or pandas.isna(fabric), key
                    else:
                        assert fabric == pytest.approx(value / run.time_scale), key
                if key in SAME_AS or key not in row:
                    assert key in SAME_AS or value is None, key  # dropped only if never set
                elif value is None:
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
        order = driver.execute_script(
            "return [...document.querySelectorAll('h2, p.warning, p.legend, table, dl.columns')]"
            ".map(e => e.tagName + (e.className ? '.' + e.className : ''))"
        )
        setting = driver.execute_script(
            "return [...document.querySelectorAll('dl.meta')][0].innerText"
        )
        warnings = driver.execute_script(
            "return [...document.querySelectorAll('p.warning')].map(p => p.innerText)"
        )
        columns = driver.execute_script(
            "return [...document.querySelectorAll('dl.columns dt')].map(d => d.innerText)"
        )
        pdfs = driver.execute_script(
            "return [...document.querySelectorAll('figcaption a')].map(a => a.href)"
        )
        rows = driver.execute_script(
            "return [...document.querySelectorAll('tbody tr')].map(r => "
            "[r.dataset.key, r.dataset.value, [...r.cells].map(c => c.innerText)])"
        )
    finally:
        driver.quit()
    # what was run and its regime lead, the verdicts' legend comes before the table
    assert order[:6] == ["H2", "P.warning", "P.warning", "H2", "P.legend", "P.legend"]
    assert order[6:8] == ["TABLE", "DL.columns"]
    assert "bytes / 128" in setting and "34 s" in setting and "33.75" not in setting
    assert "cells left out" not in setting and "1, 2, 3" in setting
    assert "coarser than the bytes / 32" in warnings[0] and "Every one of the 2" in warnings[1]
    assert columns == report.HEADER
    assert len(pdfs) == 3 and all((folder / Path(p).name).exists() for p in pdfs)
    claims = json.loads((folder / "study.json").read_text())["claims"]
    assert [key for key, _, _ in rows] == [c["key"] for c in claims]
    for (_, value, cells), claim in zip(rows, claims, strict=True):
        assert json.loads(value) == claim["median"]
        shown = "-" if claim["median"] is None else number(claim["median"])
        assert cells[4] == shown, claim["key"]
        assert cells[5] in ("yes", "NO", "-", "n/a")
    forgive = next(cells for key, _, cells in rows if key == "time.forgive")
    assert forgive[5:] == ["yes", "yes"]

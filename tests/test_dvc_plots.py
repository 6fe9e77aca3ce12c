"""`dvc plots show` / `dvc plots diff` draw offline: the project's HTML template carries the chart libraries
DVC's default page loads from a CDN (.dvc/plots/offline.html, set as plots.html_template)."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dvc.repo import Repo
from dvc_render.vega import VegaRenderer

from tests.helpers import ROOT

TEMPLATE = ROOT / ".dvc" / "plots" / "offline.html"
BUILD = ROOT / ".dvc" / "plots" / "build_offline_html.py"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_the_project_plots_page_is_the_offline_template():
    with Repo(str(ROOT)) as repo:
        configured = repo.config["plots"]["html_template"]
    assert (ROOT / ".dvc" / configured).resolve() == TEMPLATE  # DVC reads a relative path from .dvc/


def test_the_template_inlines_the_libraries_dvc_asks_the_cdn_for():
    page = TEMPLATE.read_text(encoding="utf-8")
    asked = re.findall(r"npm/([a-z-]+)@([0-9.]+)", VegaRenderer.SCRIPTS)
    inlined = re.findall(r"/\*! ([a-z-]+)@([0-9.]+) \(build/", page)
    assert inlined == asked, f"dvc-render asks for {asked}: run python {BUILD.relative_to(ROOT)}"
    assert page.count("Redistribution and use in source and binary forms") == len(asked)  # each BSD-3 licence
    assert not re.search(r"<script[^>]*\bsrc=", page)
    # DVC puts its CDN <script> tags where a template says {scripts}: this one must not say it
    assert "{plot_divs}" in page and "{scripts}" not in page


def test_every_declared_plot_is_committed():
    """A fresh clone shows every plot dvc.yaml declares. A declared plot folder missing from a revision
    (the stage never ran there, or it wrote no file: git keeps no empty folder) is what DVC calls
    "file type error ... Only JSON, YAML, CSV and TSV formats are supported"."""
    shown = subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "--json"], cwd=ROOT, capture_output=True,
                           text=True, check=True)
    errors = json.loads(shown.stdout).get("errors") or []
    assert not errors, [f"{e['rev']} {e['name']}: {e['msg']}" for e in errors]
    committed = subprocess.run(["git", "ls-files", "plots"], cwd=ROOT, capture_output=True, text=True, check=True)
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"].values()
    declared = [path for stage in stages for plot in stage.get("plots", []) for path in plot]
    assert declared and all(any(f == d or f.startswith(f"{d}/") for f in committed.stdout.split()) for d in declared)


def offline_dom(page: Path) -> str:
    """The page's DOM after headless Chromium ran its scripts, with every host name unresolvable."""
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={page.parent / 'chromium-profile'}",
                           "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=5000", "--dump-dom",
                           page.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here: check by hand as README's 'Looking at results' says")
def test_dvc_plots_show_draws_a_chart_with_no_network(tmp_path):
    """A project with this repository's DVC config and one plot: `dvc plots show` writes a page that
    draws its chart offline. DVC's default page draws nothing offline (the control)."""
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "--no-scm"], cwd=tmp_path, check=True, capture_output=True)
    shutil.copy(ROOT / ".dvc" / "config", tmp_path / ".dvc" / "config")
    shutil.copytree(TEMPLATE.parent, tmp_path / ".dvc" / "plots")
    (tmp_path / "loss.csv").write_text("step,loss\n0,2.0\n1,1.5\n2,1.2\n", encoding="utf-8")
    (tmp_path / "dvc.yaml").write_text("plots:\n  - loss.csv:\n      x: step\n      y: loss\n", encoding="utf-8")
    subprocess.run([*dvc, "plots", "show", "-o", "offline"], cwd=tmp_path, check=True, capture_output=True)
    assert '<canvas width="' in offline_dom(tmp_path / "offline" / "index.html")

    subprocess.run([*dvc, "config", "--unset", "plots.html_template"], cwd=tmp_path, check=True, capture_output=True)
    subprocess.run([*dvc, "plots", "show", "-o", "default"], cwd=tmp_path, check=True, capture_output=True)
    assert '<canvas width="' not in offline_dom(tmp_path / "default" / "index.html")

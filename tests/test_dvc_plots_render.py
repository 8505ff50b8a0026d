"""`dvc plots show` renders the evaluate stage's plots: dvc.yaml's ``plots:`` over plot data written by
`evaluation.report.plot_data`, turned into HTML by dvc through the project's offline page template
(plots/offline_template.html: the Vega scripts that `make setup` fetches from the npm registry into .cache/vega),
rendered in headless Chromium with no network, screenshotted, and every plot checked to draw its marks (the
ratio plots their line at 1.0; acceptance by depth no point for a depth a policy never reached).

`make setup` installs Chromium where it is missing (apt-get, as root); skipped only when it could not."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / ".cache" / "vega"  # fetched from the npm registry by `make setup` (not part of the repository)
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "chrome",
                                             "chrome-headless-shell") if shutil.which(n)), None)
CDN = re.compile(r'<script src="https://cdn\.jsdelivr\.net/npm/(vega|vega-lite|vega-embed)@([\d.]+)"></script>')
EMBED = re.compile(r"vegaEmbed\('#([\w-]+)', spec\);")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium): "
                                                "cannot render `dvc plots show` output headless"),
    pytest.mark.skipif(CHROMIUM is not None and not any(ASSETS.glob("vega@*.min.js")) and shutil.which("npm") is None,
                       reason="the Vega scripts are not in .cache/vega and npm is missing to fetch them (make setup)"),
]

POLICIES = ["autoregressive", "chain", "static:traversal", "selector:auto"]


def _metrics() -> dict:
    def ci(v):
        return {"value": v, "low": 0.9 * v, "high": 1.1 * v}

    pol = {p: {"tokens_per_second": ci(10.0 + i), "block_efficiency": ci(1.0 + i / 2),
               "tps_vs_autoregressive": ci(1.0 + i / 10), "offline": {"vs_autoregressive": 1.0 + i / 8}}
           for i, p in enumerate(POLICIES)}
    gains = {"autoregressive": {"0.6": {p: ci(1.1) for p in POLICIES[1:]}, "1.0": {p: ci(0.9) for p in POLICIES[1:]}}}
    return {"policies": pol, "gain_by_temperature": gains,
            "gain_by_source": {"autoregressive": {"math": {p: ci(1.2) for p in POLICIES[1:]}}},
            "acceptance_by_depth": {"chain": [0.8, 0.6, 0.5], "static:traversal": [0.85, 0.7],
                                    "selector:auto": [0.9, 0.6, 0.4]},
            "chosen": {"selector:auto": {"plain": 0.5, "traversal:2,1,2": 0.3, "specinfer:1,2,0": 0.2}},
            "findings": {"claim3_ot_acceptance_falls_with_depth": {"chain_acceptance": [0.78, 0.66, 0.61, 0.6]}}}


TEMPLATE = ROOT / "plots" / "offline_template.html"


def test_offline_template_loads_the_versions_dvc_render_pins():
    from dvc_render.vega import VegaRenderer

    pinned = CDN.findall(VegaRenderer.SCRIPTS)
    assert len(pinned) == 3, "dvc-render no longer loads vega, vega-lite and vega-embed from the CDN as expected"
    page = TEMPLATE.read_text()
    for name, version in pinned:
        assert f'src="../.cache/vega/{name}@{version}.min.js"' in page, (
            f"dvc-render now pins {name}@{version}: update plots/offline_template.html and VEGA_PACKAGES (Makefile)")


def _offline_html(html: str) -> str:
    """The page as dvc wrote it, plus a probe: render SVG and record success or failure per plot."""
    assert not CDN.search(html), "the page loads Vega from the CDN: plots/offline_template.html was not used"
    assert html.count('src="../.cache/vega/') == 3
    probe = ("<script>window.__done = []; window.onerror = function (m) { __report('error', String(m)); };"
             "function __report(k, m) { var e = document.createElement('pre'); e.className = 'probe-' + k;"
             " e.textContent = m; document.body.appendChild(e); }</script>")
    html = html.replace("</head>", probe + "</head>", 1)
    return EMBED.sub(lambda m: f"vegaEmbed('#{m.group(1)}', spec, {{renderer: 'svg', actions: false}})"
                               f".then(function () {{ __report('ok', '{m.group(1)}'); }},"
                               f" function (e) {{ __report('error', '{m.group(1)}: ' + e); }});", html)


def test_dvc_plots_show_renders_in_headless_chromium(tmp_path):
    import yaml

    from evaluation.report import plot_data
    from pipeline.config import Config

    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "dvc.yaml", repo / "dvc.yaml")
    shutil.copytree(ROOT / "plots" / "templates", repo / "plots" / "templates")
    shutil.copy(TEMPLATE, repo / "plots" / TEMPLATE.name)
    (repo / ".cache").mkdir()
    (repo / ".cache" / "vega").symlink_to(ASSETS)
    plot_data(_metrics(), repo / Config().evaluate.plots)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=repo, check=True, timeout=120)
    res = subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "--html-template",
                          f"plots/{TEMPLATE.name}", "-o", "html"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    page = repo / "html" / "offline.html"
    page.write_text(_offline_html((repo / "html" / "index.html").read_text()))
    chrome = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--allow-file-access-from-files", "--virtual-time-budget=20000",
              "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]  # no network: offline for real
    dom = subprocess.run([*chrome, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180).stdout
    shot = tmp_path / "plots.png"
    subprocess.run([*chrome, f"--screenshot={shot}", "--window-size=1400,4000", page.as_uri()],
                   capture_output=True, timeout=180)
    assert shot.is_file() and shot.stat().st_size > 20_000, "the screenshot of the plots page is missing or blank"
    errors = re.findall(r'<pre class="probe-error">(.*?)</pre>', dom, re.S)
    assert not errors, errors
    defs = {k: v for p in yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"] for k, v in p.items()}
    assert len(defs) >= 5 and sorted(re.findall(r'<pre class="probe-ok">(.*?)</pre>', dom)) == sorted(defs)
    for plot, d in defs.items():  # each plot's own <div> holds an SVG whose marks were drawn from the data
        div = dom.split(f'id="{plot}"', 1)[1].split("</svg>", 1)[0]
        assert "<svg" in div, f"{plot}: no SVG rendered"
        marks = re.findall(r'<g class="mark-(rect|line)[^"]*"[^>]*>(.*?)</g>', div, re.S)
        drawn = {k: sum(len(re.findall(r'<path[^>]* d="M', b)) for kind, b in marks if kind == k) for k in ("rect", "line")}
        (file, fields), = d["y"].items()
        rows = len((repo / file).read_text().strip().splitlines()) - 1
        if "bar" in d["template"]:
            assert drawn["rect"] == rows >= 2, f"{plot}: {drawn['rect']} bars for {rows} rows of {file}"
        else:
            assert drawn["line"] >= len(fields) >= 2, f"{plot}: {drawn['line']} lines for fields {fields}"
            cells = sum(1 for line in (repo / file).read_text().strip().splitlines()[1:]
                        for v in line.split(",")[1:] if v not in ("", "nan"))
            points = re.findall(r'<g class="mark-symbol role-mark[^"]*"[^>]*>(.*?)</g>', div, re.S)
            assert sum(len(re.findall(r"<path", b)) for b in points) == cells, f"{plot}: a missing depth drawn"
        if "ratio" in d["template"]:
            assert 'class="mark-rule' in div, f"{plot}: no reference line at 1.0"
        assert d.get("x_label") and d.get("y_label"), f"{plot}: unlabelled axes"
    assert "static:traversal" in dom and "selector:auto" in dom  # the policies label the bars

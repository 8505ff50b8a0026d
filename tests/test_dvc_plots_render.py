"""`dvc plots show` renders the evaluate stage's plots: dvc.yaml's ``plots:`` over plot data written by
`evaluation.report.plot_data`, turned into HTML by dvc, rendered in headless Chromium (offline: the page's CDN
scripts are pointed at local copies that `make setup` fetches from the npm registry into .cache/vega), and every plot checked to draw its marks.

Skipped only when no Chromium binary is found (``apt-get install chromium``)."""

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
            "chosen": {"selector:auto": {"autoregressive": 0.5, "traversal:2,1,2": 0.3, "specinfer:1,2,0": 0.2}},
            "findings": {"claim3_ot_acceptance_falls_with_depth": {"chain_acceptance": [0.78, 0.66, 0.61, 0.6]}}}


def _offline_html(html: str) -> str:
    """Point the CDN scripts at the vendored copies; render SVG and record success or failure per plot."""
    def local(m: re.Match) -> str:
        path = ASSETS / f"{m.group(1)}@{m.group(2)}.min.js"
        assert path.is_file(), (f"dvc-render now loads {m.group(1)}@{m.group(2)}, missing from {ASSETS}: add it to "
                                "VEGA_PACKAGES in the Makefile and run `make setup`")
        return f'<script src="{path.as_uri()}"></script>'

    html, n = CDN.subn(local, html)
    assert n == 3, "dvc's HTML no longer loads vega, vega-lite and vega-embed from the CDN as expected"
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
    plot_data(_metrics(), repo / Config().evaluate.plots)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=repo, check=True, timeout=120)
    res = subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "-o", "html"], cwd=repo, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    page = repo / "html" / "offline.html"
    page.write_text(_offline_html((repo / "html" / "index.html").read_text()))
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--allow-file-access-from-files", "--virtual-time-budget=20000", "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=180).stdout
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
        if d["template"].startswith("bar"):
            assert drawn["rect"] == rows >= 2, f"{plot}: {drawn['rect']} bars for {rows} rows of {file}"
        else:
            assert drawn["line"] >= len(fields) >= 2, f"{plot}: {drawn['line']} lines for fields {fields}"
    assert "static:traversal" in dom and "selector:auto" in dom  # the policies label the bars

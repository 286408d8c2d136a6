#!/usr/bin/env python3
"""Fetch the site's web assets from the npm registry into vendor/, and record what was taken.

The book must read the same offline, in a classroom or behind a firewall, so MathJax, require.js
and the Jupyter widget manager are served from the site itself. This script uses the ordinary npm
client (`npm pack`) to download each pinned package, checks the tarball against the registry's
integrity hash, copies ONLY the files the site loads into vendor/assets/ (which Sphinx publishes
as _static/), and writes vendor/manifest.json (versions, licences, sources, sha256 of every file).
What only the tests load (axe-core, for the accessibility audit in tests/browser) goes to
vendor/tests/, which is not published.

    python3 scripts/vendor_assets.py            # (re)vendor the pinned versions
    python3 scripts/vendor_assets.py --check    # verify vendor/ against the manifest, no network

Upgrading: change a version below, run the script, run `make test-site`, commit vendor/.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "vendor"
ASSETS = VENDOR / "assets"        # published as the site's _static/
TEST_ASSETS = VENDOR / "tests"    # loaded by the tests only

# MathJax's TeX autoload fetches these on first use of their macros (\boldsymbol, \cancel,
# \color, \braket, \coloneqq ...). Anything else is a 404 that the browser tests report.
MATHJAX_TEX_EXTENSIONS = ["boldsymbol", "cancel", "color", "braket", "mathtools", "bbox", "enclose"]
# MathJax's accessibility components (issue 24): semantic-enrich (with the speech rule engine,
# a11y/sre, and the MathML input it needs, input/mml) gives every formula a spoken name on load
# (_config.yml loads it); explorer and complexity are what the formula menu's Accessibility
# items load on demand (without them, 404s offline). The speech rule engine reads its rules from
# sre/mathmaps/: English (the book's language), the locale-independent base, and Nemeth (the
# menu's Braille option).
MATHJAX_A11Y = ["semantic-enrich", "sre", "explorer", "complexity"]
MATHJAX_MATHMAPS = ["base", "en", "nemeth"]

# package spec -> (licence, {file inside the tarball's package/ : destination under vendor/<root>/}),
# root "assets" (the default: the site) or "tests"
PACKAGES: dict[str, dict] = {
    "mathjax@3.2.2": {
        "license": "Apache-2.0",
        "why": "TeX -> CommonHTML typesetting (Sphinx mathjax_path); its woff fonts; a few TeX extensions; "
               "speech for every formula (a11y: semantic-enrich, the speech rule engine, the explorer)",
        "files": {
            "es5/tex-chtml.js": "mathjax/tex-chtml.js",
            "es5/output/chtml/fonts/woff-v2/": "mathjax/output/chtml/fonts/woff-v2/",
            **{f"es5/input/tex/extensions/{x}.js": f"mathjax/input/tex/extensions/{x}.js"
               for x in MATHJAX_TEX_EXTENSIONS},
            "es5/input/mml.js": "mathjax/input/mml.js",
            **{f"es5/a11y/{x}.js": f"mathjax/a11y/{x}.js" for x in MATHJAX_A11Y},
            **{f"es5/sre/mathmaps/{x}.json": f"mathjax/sre/mathmaps/{x}.json" for x in MATHJAX_MATHMAPS},
            "LICENSE": "mathjax/LICENSE",
        },
    },
    "requirejs@2.3.8": {
        "license": "MIT",
        "why": "AMD loader the widget manager bundle (embed-amd.js) is written for",
        "files": {"require.js": "requirejs/require.js"},   # licence in the file header
    },
    "@jupyter-widgets/html-manager@1.0.15": {
        "license": "BSD-3-Clause",
        "why": "renders saved ipywidgets state without a kernel (ipywidgets 8: controls 2.x, base 2.x)",
        "files": {
            "dist/embed-amd.js": "jupyter-widgets/embed-amd.js",
            "dist/embed.js.LICENSE.txt": "jupyter-widgets/embed.js.LICENSE.txt",
            # Font Awesome 5 webfonts used by widget icons; browsers take the woff2 source.
            "dist/1551f4f60c37af51121f.woff2": "jupyter-widgets/1551f4f60c37af51121f.woff2",
            "dist/7a3337626410ca2f4071.woff2": "jupyter-widgets/7a3337626410ca2f4071.woff2",
            "dist/d878b0a6a1144760244f.woff2": "jupyter-widgets/d878b0a6a1144760244f.woff2",
        },
    },
    # axe-playwright-python 0.1.8 bundles axe-core 4.12.1; the audit the tests reproduce used 4.14
    "axe-core@4.14.1": {
        "license": "MPL-2.0",
        "why": "the accessibility rules tests/browser runs on every page (WCAG 2.1 A/AA), not published",
        "root": "tests",
        "files": {"axe.min.js": "axe-core/axe.min.js", "LICENSE": "axe-core/LICENSE",
                  "LICENSE-3RD-PARTY.txt": "axe-core/LICENSE-3RD-PARTY.txt"},
    },
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def npm_pack(spec: str, dest: Path) -> dict:
    out = subprocess.run(["npm", "pack", spec, "--json", "--pack-destination", str(dest)],
                         check=True, capture_output=True, text=True).stdout
    info = json.loads(out)[0]
    tarball = dest / info["filename"]
    algo, _, expected = info["integrity"].partition("-")
    got = base64.b64encode(hashlib.new(algo, tarball.read_bytes()).digest()).decode()
    if got != expected:
        sys.exit(f"vendor: {spec}: tarball integrity mismatch ({info['integrity']} != {algo}-{got})")
    info["tarball"] = tarball
    return info


def vendor() -> None:
    if shutil.which("npm") is None:
        sys.exit("vendor: npm is needed (Debian: apt-get install npm)")
    for root in (ASSETS, TEST_ASSETS):
        if root.exists():
            shutil.rmtree(root)
    manifest = {"generated_by": "scripts/vendor_assets.py", "served_as": "_static/ (html_static_path)",
                "packages": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for spec, meta in PACKAGES.items():
            info = npm_pack(spec, tmp)
            unpack = tmp / info["filename"].removesuffix(".tgz")
            with tarfile.open(info["tarball"]) as tar:
                tar.extractall(unpack, filter="data")
            pkg = unpack / "package"
            declared = json.loads((pkg / "package.json").read_text()).get("license")
            if declared != meta["license"]:
                sys.exit(f"vendor: {spec} declares licence {declared!r}, expected {meta['license']!r}")
            files = []
            base = VENDOR / meta.get("root", "assets")
            for src, dst in meta["files"].items():
                pairs = ([(p, base / dst / p.name) for p in sorted((pkg / src).iterdir())]
                         if src.endswith("/") else [(pkg / src, base / dst)])
                for s, d in pairs:
                    d.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(s, d)
                    files.append({"path": d.relative_to(VENDOR).as_posix(), "bytes": d.stat().st_size,
                                  "sha256": sha256(d)})
            manifest["packages"].append({
                "name": info["name"], "version": info["version"], "license": meta["license"],
                "why": meta["why"],
                "source": f"https://registry.npmjs.org/{info['name']}/-/"
                          f"{info['name'].split('/')[-1]}-{info['version']}.tgz",
                "tarball": info["filename"], "integrity": info["integrity"], "files": files,
            })
            print(f"vendor: {info['name']}@{info['version']} ({meta['license']}): {len(files)} files, "
                  f"{sum(f['bytes'] for f in files) / 1e6:.2f} MB")
    (VENDOR / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"vendor: wrote {VENDOR / 'manifest.json'}")


def check() -> int:
    manifest = json.loads((VENDOR / "manifest.json").read_text())
    bad = []
    listed = set()
    for p in manifest["packages"]:
        for f in p["files"]:
            path = VENDOR / f["path"]
            listed.add(path)
            if not path.is_file() or sha256(path) != f["sha256"]:
                bad.append(f"{f['path']} ({p['name']}@{p['version']}) is missing or modified")
    extra = [p for root in (ASSETS, TEST_ASSETS) for p in root.rglob("*") if p.is_file() and p not in listed]
    bad += [f"{p.relative_to(VENDOR)} is not in manifest.json" for p in extra]
    for line in bad:
        print("vendor:", line)
    print("vendor: OK" if not bad else "vendor: run scripts/vendor_assets.py")
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="verify vendor/ against vendor/manifest.json")
    sys.exit(check() if ap.parse_args().check else vendor())

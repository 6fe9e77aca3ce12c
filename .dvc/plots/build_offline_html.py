"""Write offline.html: DVC's plots page with vega, vega-lite and vega-embed inlined, so `dvc plots show`
and `dvc plots diff` draw their charts with no network (DVC's own page loads them from a CDN).

The versions are the ones the installed dvc-render asks the CDN for; each library is the published
npm build the CDN serves for it (package.json's "jsdelivr" file), byte for byte, under its licence.
Run it again after upgrading dvc (needs npm and the npm registry):

    python .dvc/plots/build_offline_html.py
"""
import json
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

from dvc_render.vega import VegaRenderer

TEMPLATE = Path(__file__).with_name("offline.html")
CDN_SCRIPT = re.compile(r'src="https://cdn\.jsdelivr\.net/npm/([a-z-]+)@([0-9.]+)"')
PAGE = """<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    {{refresh_tag}}
    <title>DVC Plot</title>
    <!-- Written by build_offline_html.py: the chart libraries DVC's default page loads from a CDN, inlined. -->
{libraries}
    <style>
        table {{
            border-spacing: 15px;
        }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def library_script(name: str, version: str, folder: Path) -> str:
    """A <script> with the package's licence as a comment, then its CDN build unchanged."""
    subprocess.run(["npm", "pack", "--silent", f"{name}@{version}", "--pack-destination", str(folder)],
                   check=True, capture_output=True)
    with tarfile.open(folder / f"{name}-{version}.tgz") as tar:
        read = lambda member: tar.extractfile(f"package/{member}").read().decode("utf-8")  # noqa: E731
        build = json.loads(read("package.json"))["jsdelivr"]
        licence, code = read("LICENSE"), read(build)
    if "</script" in code.lower() or "{scripts}" in code or "{plot_divs}" in code:
        raise SystemExit(f"{name}@{version}: its build cannot be inlined as it is (a closing tag or a DVC placeholder)")
    return f"    <script>\n/*! {name}@{version} ({build}), npm package {name}, licence:\n{licence}*/\n{code}\n    </script>"


def main() -> None:
    versions = CDN_SCRIPT.findall(VegaRenderer.SCRIPTS)
    with tempfile.TemporaryDirectory() as folder:
        scripts = [library_script(name, version, Path(folder)) for name, version in versions]
    TEMPLATE.write_text(PAGE.format(libraries="\n".join(scripts)), encoding="utf-8")
    print(f"{TEMPLATE}: " + ", ".join(f"{n}@{v}" for n, v in versions))


if __name__ == "__main__":
    main()

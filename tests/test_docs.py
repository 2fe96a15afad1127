"""The README and the user guide say true things: the library example runs, and the links and paths exist.

``make docs`` (``mkdocs build --strict``) checks the links inside ``docs/`` and every reference to the API. The
README lies outside the site, so its links are checked here, and so are the repository paths the guide names
as inline code (``experiments/gnmt/README.md``), which mkdocs does not read as links.
"""

import contextlib
import io
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Inline code that names a file of this repository, as opposed to a run's output (runs/...) or a user's (data/...).
REPO_PATH = re.compile(r"`((?:attn_jax|configs|experiments|tests|examples|docs|\.ci)/[\w./-]*\w)`")


def _block_after(text: str, marker: str) -> str:
    _, found, rest = text.partition(marker)
    assert found, f"no {marker} marker"
    lines = rest.lstrip("\n").splitlines()
    assert lines[0].startswith("```"), lines[0]
    return "\n".join(lines[1 : lines.index("```", 1)])


def _slug(heading: str) -> str:
    """The anchor mkdocs' toc extension gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[\s-]+", "-", text).strip("-")


def _anchors(path: pathlib.Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_readme_library_example_runs_and_prints_its_shapes():
    code = _block_after(README.read_text(encoding="utf-8"), "<!-- library-example -->")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    # The comment beside the print says what it prints: [B, T, Dk] and [B, T, S] for B 2, T 3, Dk 6, S 7.
    assert out.getvalue().split("\n")[0] == "(2, 3, 6) (2, 3, 7)"
    assert "# (2, 3, 6) (2, 3, 7)" in code


def test_readme_links_point_at_existing_files_and_headings():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text(encoding="utf-8"))
    assert len(links) >= 10
    for link in links:
        if "://" in link:
            continue
        target, _, anchor = link.partition("#")
        path = ROOT / target
        assert path.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert anchor in _anchors(path), f"README.md links to {link}: no such heading in {target}"


def test_paths_named_in_the_docs_exist():
    pages = [README, *sorted(DOCS.glob("**/*.md"))]
    named = 0
    for page in pages:
        for path in REPO_PATH.findall(page.read_text(encoding="utf-8")):
            named += 1
            assert (ROOT / path).exists(), f"{page.relative_to(ROOT)} names {path}, which does not exist"
    assert named >= 20

"""The tutorials as a sphinx-gallery, without changing them.

``tutorials/NN_*.py`` are ``# %%`` cell scripts whose text cells are Markdown
(``# %% [markdown]``), which is what VS Code, Spyder and Jupytext read.  sphinx-gallery
wants a module docstring with an rST title and rST text blocks.  :func:`convert_tutorials`
writes a copy of each script into the docs tree (``docs/_gallery_src/``, generated, not
tracked) with the first Markdown cell turned into the docstring and every other Markdown
cell into an rST comment block; code cells are copied unchanged, so the copy runs exactly
like the original.  Only the Markdown the tutorials use is translated: ATX headings,
paragraphs and lists, inline code, bold/italic, indented code blocks, pipe tables,
``$$ ... $$`` display math and links.

The tutorials write their figures with ``savefig`` (and close them) into
``$CVXDP_TUTORIAL_OUT``, which ``conf.py`` points at a temporary directory.
:func:`saved_figures_scraper` is the sphinx-gallery image scraper that embeds every PNG
written there by a cell right after that cell.
"""
from __future__ import annotations

import os
import re
import shutil
import unicodedata
from pathlib import Path

__all__ = ["convert_tutorials", "convert_script", "markdown_to_rst", "saved_figures_scraper"]

_UNDERLINE = {1: "=", 2: "-", 3: "^", 4: '"'}
_HEADING = re.compile(r"^(#{1,4})\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)([*+-]|\d+\.)\s+")
# text that rST would read as an enumerated-list marker at the start of a paragraph:
# "(a) ...", "(iv) ...", "a) ...", "b. ..." (Markdown has only "1." lists)
_FALSE_ENUMERATOR = re.compile(r"^(\((?:[A-Za-z]|[ivxlcdm]+|\d+)\)|[A-Za-z][.)])\s")
_CODE_SPAN = re.compile(r"(`[^`]+`)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


# --------------------------------------------------------------------------- inline markup
def _before_ok(ch: str) -> bool:
    """Can an rST inline-markup start-string follow ``ch``?"""
    return ch == "" or ch.isspace() or unicodedata.category(ch) in ("Ps", "Pi", "Pf", "Pd", "Po")


def _after_ok(ch: str) -> bool:
    """Can an rST inline-markup end-string be followed by ``ch``?"""
    return ch == "" or ch.isspace() or unicodedata.category(ch) in ("Pe", "Pi", "Pf", "Pd", "Po")


def _escape_text(text: str) -> str:
    """Markdown prose -> rST prose: keep emphasis, escape what rST would misread."""
    text = text.replace("\\", "\\\\")
    text = text.replace("|", "\\|")                       # substitution references
    text = re.sub(r"(?<=\w)_(?=\s|$|[.,;:!?)\]])", r"\\_", text)   # name_ is a reference
    text = _LINK.sub(lambda m: f"`{m.group(1)} <{m.group(2)}>`__", text)
    return text


def _escape_plain(text: str) -> str:
    """Code shown as plain text (inside bold, where rST cannot nest a literal)."""
    return _escape_text(text).replace("*", "\\*").replace("`", "\\`")


def inline(text: str) -> str:
    """Translate the inline Markdown of one paragraph (may span lines)."""
    parts = _CODE_SPAN.split(text)
    pieces: list[tuple[str, str]] = []          # (kind, text): kind "text" or "code"
    bold = False
    for i, part in enumerate(parts):
        if i % 2:
            content = part[1:-1]
            if bold:
                pieces.append(("text", _escape_plain(content)))
            else:
                pieces.append(("code", content))
        else:
            pieces.append(("text", _escape_text(part)))
            bold ^= part.count("**") % 2 == 1
    out = []
    for j, (kind, piece) in enumerate(pieces):
        if kind == "text":
            out.append(piece)
            continue
        prev = "".join(out)[-1:] if out else ""
        nxt = ""
        for _, later in pieces[j + 1:]:
            if later:
                nxt = later[0]
                break
        literal = f"``{piece.strip()}``" if piece.strip() else "`` ``"
        out.append(("" if _before_ok(prev) else "\\ ") + literal + ("" if _after_ok(nxt) else "\\ "))
    return "".join(out)


# --------------------------------------------------------------------------- blocks
def markdown_to_rst(lines: list[str]) -> list[str]:
    """The rST of one Markdown cell (``lines`` without their leading ``# ``)."""
    out: list[str] = []
    para: list[str] = []
    in_list = False                       # the last paragraph was a list item (or its body)

    def blank():
        if out and out[-1].strip():
            out.append("")

    def flush():
        nonlocal in_list
        if not para:
            return
        first = para[0]
        m = _BULLET.match(first)
        in_list = bool(m) or (in_list and first.startswith(" "))
        body = first[m.end():] if m else first
        if _FALSE_ENUMERATOR.match(body.lstrip()):
            lead = len(first) - len(first.lstrip()) if not m else m.end()
            first = first[:lead] + "\\" + first[lead:]
        para[0] = first
        # a bullet line in the middle of a paragraph starts a new list item: split there
        chunk: list[str] = []
        for line in para:
            if chunk and _BULLET.match(line):
                out.extend(inline("\n".join(chunk)).split("\n"))
                chunk = []
            chunk.append(line)
        out.extend(inline("\n".join(chunk)).split("\n"))
        para.clear()

    i = 0
    prev_blank = True
    while i < len(lines):
        line = lines[i].rstrip()
        if not line.strip():
            flush()
            blank()
            prev_blank = True
            i += 1
            continue
        head = _HEADING.match(line)
        if head and not line.startswith(" "):
            flush()
            blank()
            title = inline(head.group(2))
            out += [title, _UNDERLINE[len(head.group(1))] * max(len(title), 3), ""]
            in_list = False
            prev_blank = True
            i += 1
            continue
        if line.lstrip().startswith("$$"):
            flush()
            blank()
            body = [line.strip()[2:]]
            while not body[-1].rstrip().endswith("$$") and i + 1 < len(lines):
                i += 1
                body.append(lines[i].strip())
            body[-1] = body[-1].rstrip()[:-2]
            out += [".. math::", ""] + ["   " + b.strip() for b in body if b.strip()] + [""]
            in_list = False
            prev_blank = True
            i += 1
            continue
        if line.startswith("|"):
            flush()
            blank()
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            out += [".. list-table::", "   :header-rows: 1", ""]
            for row in rows:
                for k, cell in enumerate(row):
                    out.append(("   * - " if k == 0 else "     - ") + inline(cell))
            out.append("")
            in_list = False
            prev_blank = True
            continue
        indent = len(line) - len(line.lstrip())
        if indent >= 4 and prev_blank:
            flush()
            blank()
            block = []
            while i < len(lines) and (not lines[i].strip() or
                                      len(lines[i]) - len(lines[i].lstrip()) >= indent):
                block.append(lines[i].rstrip())
                i += 1
            while block and not block[-1].strip():
                block.pop()
            lead = " " * (indent - 4 if in_list and indent >= 6 else 0)
            out += [lead + ".. code-block:: text", ""] + block + [""]
            prev_blank = True
            continue
        para.append(line)
        prev_blank = False
        i += 1
    flush()
    while out and not out[-1].strip():
        out.pop()
    return out


def _cells(source: str) -> list[tuple[str, list[str]]]:
    """``[(kind, lines)]``: kind ``"markdown"`` or ``"code"``; text before the first marker
    is a code cell; code cells with nothing but blank lines are dropped."""
    cells: list[tuple[str, list[str]]] = [("code", [])]
    for line in source.split("\n"):
        if line.startswith("# %%"):
            cells.append(("markdown" if "[markdown]" in line else "code", []))
        else:
            cells[-1][1].append(line)
    return [c for c in cells if c[0] == "markdown" or any(x.strip() for x in c[1])]


def _uncomment(lines: list[str]) -> list[str]:
    text = []
    for line in lines:
        if line.startswith("# "):
            text.append(line[2:])
        elif line.strip() == "#":
            text.append("")
        elif not line.strip():
            text.append("")
        else:
            raise ValueError(f"a Markdown cell has a non-comment line: {line!r}")
    while text and not text[-1].strip():
        text.pop()
    return text


def convert_script(source: str, name: str = "<tutorial>", mode: str | None = None) -> str:
    """A ``# %%`` script with Markdown cells -> the same script in sphinx-gallery's format.

    ``mode`` (e.g. ``"fast"``) is written into the first code cell as a sphinx-gallery config
    comment (removed from the rendered page): sphinx-gallery re-runs an example only when its
    source changes, so a build in another tutorial mode must change the source."""
    cells = _cells(source)
    if not cells or cells[0][0] != "markdown":
        raise ValueError(f"{name}: the first cell must be a Markdown cell with the title")
    title = markdown_to_rst(_uncomment(cells[0][1]))
    doc = "\n".join(title)
    if '"""' in doc:
        raise ValueError(f"{name}: the first cell contains triple quotes")
    out = ['r"""', doc, '"""', ""]
    marked = mode is None
    for kind, lines in cells[1:]:
        if kind == "markdown":
            out.append("# %%")
            out += [("# " + t) if t else "#" for t in markdown_to_rst(_uncomment(lines))]
            out.append("")
        else:
            while lines and not lines[-1].strip():
                lines = lines[:-1]
            out.append("# %%")
            # a comment right under "# %%" would become a text block: keep it code
            if lines and lines[0].lstrip().startswith("#"):
                out.append("")
            out += lines
            if not marked:
                out.append(f"# sphinx_gallery_cvxdp_tutorial_mode = {mode!r}")
                marked = True
            out.append("")
    return "\n".join(out)


def convert_tutorials(src: Path, dest: Path, header: str, mode: str | None = None) -> list[Path]:
    """Convert ``src/[0-9][0-9]_*.py`` into ``dest`` (rewriting only what changed) and write
    ``dest/GALLERY_HEADER.rst``; files in ``dest`` without a source are removed.  ``mode``:
    see :func:`convert_script`."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    wanted = {"GALLERY_HEADER.rst"}
    for script in sorted(src.glob("[0-9][0-9]_*.py")):
        text = convert_script(script.read_text(encoding="utf-8"), script.name, mode)
        target = dest / script.name
        wanted.add(script.name)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
        written.append(target)
    head = dest / "GALLERY_HEADER.rst"
    if not head.exists() or head.read_text(encoding="utf-8") != header:
        head.write_text(header, encoding="utf-8")
    for stale in dest.iterdir():
        if stale.is_file() and stale.name not in wanted:
            stale.unlink()
    return written


# --------------------------------------------------------------------------- figures
_SEEN: dict[str, int] = {}


def saved_figures_scraper(block, block_vars, gallery_conf):
    """Embed the PNGs the cell just wrote into ``$CVXDP_TUTORIAL_OUT`` (new or rewritten)."""
    from sphinx_gallery.scrapers import figure_rst

    out_dir = os.environ.get("CVXDP_TUTORIAL_OUT")
    if not out_dir or not Path(out_dir).is_dir():
        return ""
    new = []
    for png in sorted(Path(out_dir).glob("*.png"), key=lambda p: (p.stat().st_mtime_ns, p.name)):
        stamp = png.stat().st_mtime_ns
        if _SEEN.get(png.name) != stamp:
            _SEEN[png.name] = stamp
            new.append(png)
    if not new:
        return ""
    paths = []
    iterator = block_vars["image_path_iterator"]
    for png in new:
        target = Path(next(iterator))
        shutil.copyfile(png, target)
        paths.append(str(target))
    return figure_rst(paths, gallery_conf["src_dir"])

"""The link and image targets of a Markdown text, for the docs' and the release's link checks."""

from urllib.parse import urlsplit


def markdown_links(text: str) -> list[str]:
    """The link and image targets of a Markdown text (not what code spans or blocks show)."""
    import markdown_it  # myst-parser's dependency (the docs extra)

    found = []
    stack = markdown_it.MarkdownIt("commonmark").parse(text)
    while stack:
        token = stack.pop(0)
        stack[:0] = token.children or []
        if token.type == "link_open":
            found.append(token.attrGet("href"))
        elif token.type == "image":
            found.append(token.attrGet("src"))
    return found


def is_external(link: str) -> bool:
    """Whether a link names its own scheme or host (http://…, mailto:…, //host/…)."""
    parts = urlsplit(link)
    return bool(parts.scheme or parts.netloc)

"""mkdocs hooks (mkdocs.yml `hooks:`) for the documentation site.

- A page holding `<!-- trainfeed-cli-usage -->` gets, in its place, `trainfeed --help` and each
  subcommand's help, taken from `trainfeed.cli.main.build_parser()` when the site is built, so the
  command-line page cannot drift from the parser.
- A link that leaves docs/ for a file of the repository (`[deploy/k8s/](../deploy/k8s)`) works
  where the Markdown is read in the repository, but the site holds no copy of those files: it
  becomes its text. Its target must exist; a link to a missing file is a warning, which fails
  `mkdocs build --strict`, as a broken link between pages does.

Only the functions' names tie this module to mkdocs; it imports nothing of mkdocs.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path
from typing import Any

# Under "mkdocs.": the logger whose warnings --strict counts.
logger = logging.getLogger("mkdocs.hooks.trainfeed")

CLI_MARKER = "<!-- trainfeed-cli-usage -->"
#: Help is wrapped to this width, whatever the terminal that builds the site.
HELP_WIDTH = "100"
#: `[text](../path)` or `[text](../path#anchor)`: a link leaving the docs folder.
REPOSITORY_LINK = re.compile(r"\[([^\]]*)\]\((\.\./[^)\s#]*)(#[^)\s]*)?\)")


def cli_usage() -> str:
    """Markdown: `trainfeed --help`, then one section per subcommand with its --help."""
    from trainfeed.cli.main import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH  # argparse wraps to $COLUMNS
    try:
        parser = build_parser()
        parts = ["## `trainfeed`", "", "```text", parser.format_help().rstrip(), "```", ""]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    parts += [f"## `trainfeed {name}`", "", "```text",
                              sub.format_help().rstrip(), "```", ""]
        return "\n".join(parts)
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def repository_links(markdown: str, page_path: Path, docs_dir: Path) -> str:
    """`markdown` with each link to a repository file outside `docs_dir` replaced by its text;
    a warning for each such link whose target does not exist."""
    def replace(match: re.Match[str]) -> str:
        target = (page_path.parent / match.group(2)).resolve()
        if target.is_relative_to(docs_dir):
            return match.group(0)  # a page or file of the site: mkdocs checks it
        if not target.exists():
            logger.warning("%s links to %s, which does not exist in the repository",
                           page_path.relative_to(docs_dir), match.group(2))
        return match.group(1)
    return REPOSITORY_LINK.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    """mkdocs's page hook: the command-line usage expanded, links to repository files unlinked."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_usage())
    docs_dir = Path(config["docs_dir"]).resolve()
    return repository_links(markdown, docs_dir / page.file.src_uri, docs_dir)

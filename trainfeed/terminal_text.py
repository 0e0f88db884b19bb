r"""Untrusted text made safe for a terminal or a log: the one escaping rule of trainfeed's CLI.

A FAILED report's reason (any holder of a job token sends one), an uploads-board record (any
writer of the storage drops one), a reader's name or an error a master relays reach
`trainfeed status`, `--watch`, `status --uploads` and the logs. Written raw, an ESC sequence in
them sets the window title (`ESC ] 0 ; … BEL`), clears the screen (`ESC [ 2 J`), and a carriage
return or a newline starts a fake line ("all good"); the Unicode bidi overrides (U+202E…)
reorder what the eye reads.

:func:`visible` shows every character that `str.isprintable` calls non-printable as its escape,
as `repr()` writes it (`\x1b`, `\r`, `\n`, `\x9b`, `\u202e`, `\U000e0001`): the C0 and C1
controls and DEL (Unicode category Cc), the format characters (Cf: bidi controls, zero-width
characters), line and paragraph separators, spaces other than " ", surrogates, private-use and
unassigned code points. Printable text, non-ASCII letters and emoji included, is returned as it
is, so the function is idempotent and costs one `isprintable()` call for ordinary text. A
backslash is not doubled: the output is for people, and `C:\data` must read as written (the
price: a literal `\x1b` and an escaped ESC look alike).

This module sits at the bottom of the house (no trainfeed imports).

Example:
    >>> visible("partition 3: \x1b]0;pwned\x07\x1b[2J\rall good")
    'partition 3: \\x1b]0;pwned\\x07\\x1b[2J\\rall good'
    >>> visible("ünï 🙂 C:\\data")
    'ünï 🙂 C:\\data'
    >>> visible("line 1\nline 2", multiline=True)
    'line 1\nline 2'
"""
from __future__ import annotations

__all__ = ["escape_char", "visible"]

# Escapes repr() writes with a letter rather than a code (and the tab, shown too: a field's tab
# would shift the columns after it).
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def escape_char(char: str) -> str:
    """The escape shown for one character: `\\t`, `\\n`, `\\r`, else `\\xhh`, `\\uhhhh` or
    `\\Uhhhhhhhh` by its code point (as `repr()` writes them)."""
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str, multiline: bool = False) -> str:
    """`text` with every non-printable character (`str.isprintable`) shown as its escape.

    Args:
        text: untrusted text (a reason, a host name, a board field, an error relayed).
        multiline: keep "\\n" as a line break (a traceback, an error message of several lines);
            by default a newline is shown as `\\n` too, so that one field stays on its line.

    Returns:
        Text holding no character that can move the cursor, change the terminal's state or
        reorder what is shown; `text` itself when it is all printable.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or (multiline and char == "\n")
                   else escape_char(char) for char in text)

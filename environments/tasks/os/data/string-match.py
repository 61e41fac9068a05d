"""Check: the answer ($1) equals the expected output ($2), line ends and outer space aside."""

import sys


def norm(text):
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


sys.exit(0 if norm(sys.argv[1]) == norm(sys.argv[2]) else 1)

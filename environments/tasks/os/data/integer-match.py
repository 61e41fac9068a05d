"""Check: the answer ($1) and the expected output ($2) are the same integer."""

import sys

try:
    sys.exit(0 if int(sys.argv[1].strip()) == int(sys.argv[2].strip()) else 1)
except ValueError:
    sys.exit(1)

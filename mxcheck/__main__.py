"""``python -m mxcheck``: the mxcheck command line."""

from mxcheck.cli import main

raise SystemExit(main())

"""``python -m tokenstate`` — the same CLI as the ``tokenstate`` command."""

from tokenstate.tools.cli import main

raise SystemExit(main())

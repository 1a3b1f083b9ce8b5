"""``python -m tokenstate`` — the same CLI as the ``tokenstate`` command."""

from tokenstate.runtime.cli import main

raise SystemExit(main())

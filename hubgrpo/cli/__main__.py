"""``python -m hubgrpo.cli``: the same as the ``hubgrpo`` command."""

import sys

from hubgrpo.cli.main import main

sys.exit(main())

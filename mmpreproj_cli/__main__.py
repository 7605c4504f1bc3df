"""`python -m mmpreproj_cli` = the `mmpreproj` console script (without loading the library for --help)."""

import sys

from .command import main

sys.exit(main())

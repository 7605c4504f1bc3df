"""`python -m mmpreproj` = the `mmpreproj` console script."""

import sys

from .cli import main

sys.exit(main())

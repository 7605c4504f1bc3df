"""`python -m mmpreproj` = the `mmpreproj` console script (this route imports the library first)."""

import sys

from mmpreproj_cli.command import main

sys.exit(main())

"""`python -m mmpreproj` = the `mmpreproj` console script (this route imports the library first).

An entry point, not library code: the one module of `mmpreproj` that imports the command (`mmpreproj_cli`).
"""

import sys

from mmpreproj_cli.command import main

sys.exit(main())

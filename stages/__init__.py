"""The pipeline's stages, each run as `python -m stages.<name>` (dvc.yaml).

Python imports this package before the stage's module, and sets sys.argv[0] to "-m" while it does:
from here on Ctrl-C ends a stage in one line with exit code 130, during its imports too
(lib.core.errors.end_on_ctrl_c). Imported otherwise (by the tests), it changes nothing.
"""
import sys

from lib.core.errors import end_on_ctrl_c

if sys.argv[0] == "-m":
    end_on_ctrl_c()

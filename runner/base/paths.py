"""Where this package lies: what a child process needs on its path, and where the skill's own files are."""

import os

__all__ = ["PACKAGE_PARENT"]

#: The folder that holds the ``runner`` package: the skill's (or the installed plugin's) root, which a child process
#: started with ``-m runner...`` needs on its path. Found from this file, so it follows the package wherever it lies.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sys

from nvfs.cli import main

sys.exit(main())

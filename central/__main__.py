import sys

from central.cli import main

sys.exit(main())

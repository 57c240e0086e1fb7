import sys

from model_sync.cli import main

sys.exit(main())

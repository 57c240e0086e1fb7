"""``python -m hybrid_llm``: the same as the ``hybrid-llm`` command."""

import sys

from hybrid_llm.cli import main

sys.exit(main())

"""``python -m geo_router`` runs the ``geo-router`` command."""

import sys

from geo_router.cli import main

sys.exit(main())

"""One-off studies: each script answers one question about this system by
measuring it and prints its figures (ratios measured in one run); its history
of results sits next to it as ``<name>.results.md``.

Run them from the repository root as modules, e.g.
``python -m studies.batching --help``. Product commands (the load generator,
the simulator and its check) are ``hybrid-llm`` subcommands, not studies.
"""

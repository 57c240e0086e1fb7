"""Shared building blocks of the hybrid LLM serving services.

Only what two or more services need lives here: OpenAI wire types and the SSE
codec (:mod:`servekit.wire`, :mod:`servekit.sse`), the error tree
(:mod:`servekit.errors`), the engine protocol and engines
(:mod:`servekit.engine`), the registry backends (:mod:`servekit.registry`),
settings loading (:mod:`servekit.config`) and metric helpers.
"""

__version__ = "0.1.0"

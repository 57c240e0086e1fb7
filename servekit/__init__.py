"""Shared building blocks of the hybrid LLM serving services.

Only what two or more services need lives here: OpenAI wire types and the SSE
codec (:mod:`servekit.wire`, :mod:`servekit.sse`), the error tree
(:mod:`servekit.errors`), the engine protocol and engines
(:mod:`servekit.engine`), the registry backends (:mod:`servekit.registry`),
settings loading (:mod:`servekit.config`), metric helpers, and trust between
the tiers: service tokens (:mod:`servekit.service_auth`), TLS
(:mod:`servekit.tls`), what a client presents to a peer (:mod:`servekit.peers`)
and secret settings and redaction (:mod:`servekit.secrets`).
"""

__version__ = "0.1.0"

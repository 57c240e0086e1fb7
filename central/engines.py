"""The engine each replica is reached through: the shared OpenAI-HTTP engine.

Every replica kind speaks the OpenAI API over HTTP, so one engine type
serves them all. Its own background load probe is off: the replica's
supervision loop already probes health and scrapes load, per engine kind.
"""

from __future__ import annotations

from central.commands import Endpoint
from central.replica import EngineFactory
from central.settings import CentralSettings
from servekit.engine.openai_http import OpenAIHTTPEngine, OpenAIHTTPSettings
from servekit.peers import PeerCredentials

__all__ = ["http_engine", "http_engine_factory"]


def http_engine(
    endpoint: Endpoint,
    *,
    served_name: str | None = None,
    version: str = "",
    peer: PeerCredentials | None = None,
) -> OpenAIHTTPEngine:
    settings = OpenAIHTTPSettings(
        base_url=endpoint.base_url,
        model=endpoint.upstream_model,
        served_name=served_name,
        capacity=endpoint.capacity,
        health_path=endpoint.health_path,
        engine_errors_as_400=endpoint.trtllm,
        # trtllm-serve's request models forbid fields they do not declare.
        send_cache_salt=not endpoint.trtllm,
    )
    return OpenAIHTTPEngine(settings, probe=None, version=version, peer=peer)


def http_engine_factory(settings: CentralSettings) -> EngineFactory:
    """Engines that call replicas with ``replica_client``'s token and TLS trust."""
    peer = settings.replica_client.credentials()

    def build(endpoint: Endpoint) -> OpenAIHTTPEngine:
        return http_engine(
            endpoint, served_name=settings.model, version=settings.version, peer=peer
        )

    return build

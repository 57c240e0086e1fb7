"""model_sync: model version registry, staged rollouts with gates, and edge reconcile.

- :class:`Reconciler` (edge side): follow ``nodes/<id>/desired``, download and
  verify, hot swap through the agent's callable, report ``nodes/<id>/actual``.
- :class:`Controller`: advance the active rollout wave by wave, gate, roll back.
- :class:`SyncStore`: typed access to the KV documents (:mod:`model_sync.keys`).
- :mod:`model_sync.ops`: operator actions; :mod:`model_sync.cli`: ``model-sync``
  (its flags), whose commands live by concern in :mod:`model_sync.cli_versions`,
  :mod:`model_sync.cli_rollouts` and :mod:`model_sync.cli_nodes`.
"""

from model_sync.agent import Reconciler, ReconcilerSettings, SwapFn
from model_sync.controller import Controller
from model_sync.download import Downloader, DownloadError
from model_sync.records import ActualState, ArtifactRecord, DesiredState, TrafficShares
from model_sync.store import SyncStore

__all__ = [
    "ActualState",
    "ArtifactRecord",
    "Controller",
    "DesiredState",
    "DownloadError",
    "Downloader",
    "Reconciler",
    "ReconcilerSettings",
    "SwapFn",
    "SyncStore",
    "TrafficShares",
]

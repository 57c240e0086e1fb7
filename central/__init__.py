"""The central gateway: engine replicas (vLLM, TensorRT-LLM, llama.cpp) behind
one OpenAI-compatible endpoint.

- :mod:`central.specs`, :mod:`central.settings`: the YAML settings tree; configs
  an engine would refuse fail at load.
- :mod:`central.commands`: a replica spec as the exact process to launch.
- :mod:`central.supervisor`, :mod:`central.replica`: process, health, load, restarts.
- :mod:`central.scrape`: vLLM / trtllm-serve / stand-in load over HTTP.
- :mod:`central.balancer`: least-loaded with bounded-load prefix affinity.
- :mod:`central.pool`: the replicas as one :class:`~servekit.engine.protocol.Engine`.
- :mod:`central.app`: ``create_app(settings)`` over the shared serving layer.

See ``docs/central.md``.
"""

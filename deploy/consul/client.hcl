# Consul client agent on every node (edge, router, center, controller hosts).
# The services talk to the agent on their own host (CONSUL_HTTP_ADDR=
# https://127.0.0.1:8501, HTTPS only; never a load balancer or a server: registration and
# heartbeats act on the agent that answers). The agent gossips with the
# servers of its datacenter (3 or 5, see server.hcl). The fleet's registry is
# ONE datacenter: routers and model-sync read one catalog and one KV, and an
# instance always registers into its own agent's datacenter.
datacenter = "fleet"
data_dir   = "/var/lib/consul"
node_name  = "edge-a-017"          # unique per node
bind_addr  = "{{ GetPrivateInterfaces | include \"network\" \"10.0.0.0/8\" | attr \"address\" }}"
client_addr = "127.0.0.1"
retry_join = ["consul-a-1.internal", "consul-a-2.internal", "consul-a-3.internal"]

# Node metadata the operators filter by; services also tag tier and region.
node_meta {
  region = "region-a"
  tier   = "edge"
}

acl {
  enabled        = true
  default_policy = "deny"
  tokens {
    # The agent's own token. The services get theirs from a file, never from a
    # unit or a YAML: /etc/hybrid-llm/credentials/consul-token, handed over by
    # systemd (LoadCredential=consul-token:...) and named in each service's YAML
    # as registry.consul.token_file: $CREDENTIALS_DIRECTORY/consul-token
    # (or CONSUL_HTTP_TOKEN_FILE). Policies per role: policy-instance.hcl,
    # policy-router.hcl, policy-controller.hcl, e.g.
    #   consul acl token create -policy-name hybrid-llm-instance -format json | jq -r .SecretID \
    #     | install -m 0600 /dev/stdin /etc/hybrid-llm/credentials/consul-token
    agent = "REPLACE-WITH-AGENT-TOKEN"
  }
}

encrypt = "REPLACE-WITH-GOSSIP-KEY"   # consul keygen
tls {
  defaults {
    ca_file   = "/etc/consul.d/tls/consul-agent-ca.pem"
    verify_outgoing = true
  }
  internal_rpc { verify_server_hostname = true }
  # The local HTTPS API the services call (registry.consul.address https://127.0.0.1:8501,
  # ca_cert /etc/hybrid-llm/tls/consul-ca.pem).
  https {
    cert_file = "/etc/consul.d/tls/client.pem"
    key_file  = "/etc/consul.d/tls/client-key.pem"
  }
}

# Health: instances register with a TTL check; each heartbeat passes it while
# the instance is ready and warns while it is not (loading, draining), with its
# load report as the check output. The agent forwards a status change to the
# servers at once and an output-only change only after check_update_interval
# (Consul's default 5m: 2.5-7.5 min late). Routers do not depend on that: they
# poll each instance's /load. What reads load figures from the catalog
# (model-sync status, rollout gates) gets them at most 45 s old with 30s; 0
# would turn every heartbeat into a write on the servers. The services check
# these settings at start (/v1/agent/self, needs agent:read) and warn.
check_update_interval = "30s"
discard_check_output  = false   # the catalog's copy of each load report
check_output_max_size = 4096    # Consul's default; a load report is ~1 KB
# An instance that stops beating turns critical within ttl_s and leaves the
# routers' candidates; DeregisterCriticalServiceAfter (floored at 1m by the
# agent, reaped every 30 s) removes it for good.
telemetry {
  prometheus_retention_time = "60s"
  disable_hostname          = true
}
ports {
  http  = -1      # no plain-text API
  https = 8501
  grpc  = 8502
}

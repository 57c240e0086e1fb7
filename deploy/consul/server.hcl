# Consul server (3 per datacenter). The KV store holds desired model versions,
# node states, rollout plans and history under models/, nodes/, rollouts/,
# history/ and locks/; the rollout lock is a session.
datacenter       = "fleet"
data_dir         = "/var/lib/consul"
server           = true
bootstrap_expect = 3
node_name        = "consul-a-1"
bind_addr        = "{{ GetPrivateInterfaces | include \"network\" \"10.0.0.0/8\" | attr \"address\" }}"
client_addr      = "127.0.0.1"
retry_join       = ["consul-a-1.internal", "consul-a-2.internal", "consul-a-3.internal"]
# One datacenter for the whole fleet (see client.hcl); a WAN-joined datacenter
# is not read by the routers (they follow one catalog), so none is joined here.
ui_config { enabled = true }
acl {
  enabled                  = true
  default_policy           = "deny"
  enable_token_persistence = true
}
encrypt = "REPLACE-WITH-GOSSIP-KEY"
performance { raft_multiplier = 1 }
# Sessions (the rollout lock) may not be shorter than this; model-sync's
# lock_ttl_s (15 s) must stay above it. Consul's default.
session_ttl_min = "10s"
telemetry { prometheus_retention_time = "60s" }

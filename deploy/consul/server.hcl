# Consul server (3 per datacenter). The KV store holds desired model versions,
# rollout plans and status under hybrid-llm/; the rollout lock is a session.
datacenter       = "region-a"
data_dir         = "/var/lib/consul"
server           = true
bootstrap_expect = 3
node_name        = "consul-a-1"
bind_addr        = "{{ GetPrivateInterfaces | include \"network\" \"10.0.0.0/8\" | attr \"address\" }}"
client_addr      = "127.0.0.1"
retry_join       = ["consul-a-1.internal", "consul-a-2.internal", "consul-a-3.internal"]
# Multi-region: WAN-join the other datacenters' servers.
retry_join_wan   = ["consul-b-1.internal", "consul-center-1.internal"]
ui_config { enabled = true }
acl {
  enabled                  = true
  default_policy           = "deny"
  enable_token_persistence = true
}
encrypt = "REPLACE-WITH-GOSSIP-KEY"
performance { raft_multiplier = 1 }
telemetry { prometheus_retention_time = "60s" }

# Consul client agent on every node (edge, router, center, controller hosts).
# The services talk to the local agent (CONSUL_HTTP_ADDR=127.0.0.1:8500); the
# agent gossips with the servers of its datacenter. Servers: 3 or 5 per
# datacenter (see server.hcl); one datacenter per region, WAN-joined, or one
# datacenter for a small fleet.
datacenter = "region-a"
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
    # The agent's own token; the services get theirs via CONSUL_HTTP_TOKEN
    # (policy: service:hybrid-llm write, key_prefix:hybrid-llm/ write, session write).
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
}

# Health: instances register with a TTL check and heartbeat their load; a node
# that stops heartbeating turns critical within ttl_s and leaves the router's
# candidate set; DeregisterCriticalServiceAfter removes it for good.
telemetry {
  prometheus_retention_time = "60s"
  disable_hostname          = true
}
ports {
  grpc = 8502
}

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
    # The agent's own token. The services get theirs from a file, never from a
    # unit or a YAML: /etc/hybrid-llm/credentials/consul-token, handed over by
    # systemd (LoadCredential=consul-token:...) and named in each service's YAML
    # as registry.consul.token_file: $CREDENTIALS_DIRECTORY/consul-token
    # (or CONSUL_HTTP_TOKEN_FILE). Policy: hybrid-llm-policy.hcl
    #   consul acl token create -policy-name hybrid-llm -format json | jq -r .SecretID \
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

# Health: instances register with a TTL check and heartbeat their load; a node
# that stops heartbeating turns critical within ttl_s and leaves the router's
# candidate set; DeregisterCriticalServiceAfter removes it for good.
telemetry {
  prometheus_retention_time = "60s"
  disable_hostname          = true
}
ports {
  http  = -1      # no plain-text API
  https = 8501
  grpc  = 8502
}

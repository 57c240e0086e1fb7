# ACL policy for geo routers: discovery and canary shares, read-only.
#   consul acl policy create -name hybrid-llm-router -rules @policy-router.hcl
# Without service and node read the health listing comes back filtered (empty,
# with X-Consul-Results-Filtered-By-ACLs): the router then logs an error and
# counts registry_catalog_errors_total{kind="acl_filtered"}.
service "hybrid-llm" { policy = "read" }
node_prefix ""       { policy = "read" }
agent_prefix ""      { policy = "read" }
key_prefix "models/" { policy = "read" }

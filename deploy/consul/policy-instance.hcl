# SUPERSEDED by policy-node.hcl.tmpl (model-sync node-policy): this shared policy
# lets any node write every node's keys, so one stolen node could rewrite the
# fleet's desired versions. Kept for fleets migrating; do not issue new tokens.
# ACL policy for edge agents and central gateways (one token per host):
#   consul acl policy create -name hybrid-llm-instance -rules @policy-instance.hcl
# Register and heartbeat the hybrid-llm service; list it (a heartbeat answered
# 404 checks whether another node's agent holds the instance); read the
# agent's settings for the start-up check; follow desired model versions and
# report this node's state.
service "hybrid-llm" { policy = "write" }
node_prefix ""       { policy = "read" }
agent_prefix ""      { policy = "read" }
key_prefix "models/" { policy = "read" }
key_prefix "nodes/"  { policy = "write" }

# ACL policy for model-sync (controller and operators' CLI): desired state,
# rollout plans, history, and the one-rollout-at-a-time lock (a session).
#   consul acl policy create -name hybrid-llm-controller -rules @policy-controller.hcl
service "hybrid-llm"   { policy = "read" }
node_prefix ""         { policy = "read" }
agent_prefix ""        { policy = "read" }
key_prefix "models/"   { policy = "write" }
key_prefix "nodes/"    { policy = "write" }
key_prefix "rollouts/" { policy = "write" }
key_prefix "history/"  { policy = "write" }
key_prefix "locks/"    { policy = "write" }
session_prefix ""      { policy = "write" }

# ACL policy for the hybrid-llm services (consul acl policy create -name hybrid-llm -rules @hybrid-llm-policy.hcl).
service "hybrid-llm" { policy = "write" }
service_prefix "" { policy = "read" }
node_prefix "" { policy = "read" }
key_prefix "hybrid-llm/" { policy = "write" }
session_prefix "" { policy = "write" }

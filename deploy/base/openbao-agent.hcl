# EXAMPLE: the OpenBao Agent beside `serve`, `migrate` and `sweep` (the openbao-agent sidecar of
# memory-service.yaml, migrate-job.yaml and sweep-cronjob.yaml). It logs in to OpenBao's Kubernetes auth as the
# pod's ServiceAccount (governed-memory), with a projected token of audience "openbao" that the kubelet keeps
# fresh, keeps the OpenBao token it gets renewed, and logs in again when it can no longer renew it, each time
# writing the token to the file sink below: an emptyDir the store's container mounts read-only and reads through
# KAGENT_GOVERNED_MEMORY_KEY_STORE_TOKEN=@/vault/secrets/token, again whenever OpenBao refuses the token it holds.
# No static token exists anywhere. OpenBao's side (the role, its audience, the policy): docs/operator.md,
# "Key store". The server's address and CA come from the sidecar's BAO_ADDR and BAO_CACERT.
auto_auth {
  method "kubernetes" {
    mount_path = "auth/kubernetes"
    config = {
      role       = "governed-memory"
      token_path = "/var/run/secrets/openbao/token"
    }
  }
  sink "file" {
    config = {
      path = "/vault/secrets/token"
      mode = 0400
    }
  }
}

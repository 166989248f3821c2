{{/* Pod security context of our own images (restricted Pod Security).
securityContext: {{- include "mo.podSecurityContext" $ | nindent 2 }} */}}
{{- define "mo.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container security context of our own images (restricted Pod Security).
securityContext: {{- include "mo.containerSecurityContext" $ | nindent 2 }} */}}
{{- define "mo.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

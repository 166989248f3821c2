{{/* The in-cluster NATS client URL, or the external one. */}}
{{- define "mo.natsURL" -}}
{{- if .Values.global.nats.url -}}
{{- .Values.global.nats.url -}}
{{- else -}}
{{- printf "nats://%s-nats.%s.svc:4222" (include "mo.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/*
NATS client wiring of a container: the environment every NATS client reads.
The nats-wiring post-renderer rewrites it from the resource, so that every
component uses one resolved URL and one set of credentials.
*/}}
{{- define "mo.natsEnv" -}}
- name: NATS_URL
  value: {{ include "mo.natsURL" . | quote }}
- name: NATS_STREAM_REPLICAS
  value: {{ .Values.global.nats.replicas | quote }}
{{- if and .Values.global.nats.url .Values.global.nats.credentialsSecret }}
- name: NATS_CREDENTIALS_DIR
  value: /etc/orchestra/nats
{{- end }}
{{- end -}}

{{- define "mo.natsVolumeMounts" -}}
{{- if and .Values.global.nats.url .Values.global.nats.credentialsSecret }}
- name: nats-credentials
  mountPath: /etc/orchestra/nats
  readOnly: true
{{- end }}
{{- end -}}

{{- define "mo.natsVolumes" -}}
{{- if and .Values.global.nats.url .Values.global.nats.credentialsSecret }}
- name: nats-credentials
  secret:
    secretName: {{ .Values.global.nats.credentialsSecret | quote }}
    defaultMode: 0440
{{- end }}
{{- end -}}

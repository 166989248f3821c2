{{/*
NATS client wiring. global.nats holds what every client of the queue is told,
resolved once by the operator's values translator from the resource: url
(spec.nats.url, or the in-cluster server's Service "<release>-nats"),
replicas (of the in-cluster server and of every stream) and
credentialsSecretRef (spec.nats.credentialsSecretRef). These templates print
those values and compute none, so no two clients can disagree.
*/}}

{{/* The URL every NATS client connects to.
url: {{ include "mo.natsURL" $ | quote }} */}}
{{- define "mo.natsURL" -}}
{{- required "global.nats.url is required: the URL of the NATS server every client connects to (`orchestra values -f cr.yaml` prints the values the operator renders)" .Values.global.nats.url -}}
{{- end -}}

{{/* Where a client finds the NATS credentials file (key "creds" of the
credentials Secret), when there is one.
{{- with include "mo.natsCredentialsFile" $ }} */}}
{{- define "mo.natsCredentialsFile" -}}
{{- with .Values.global.nats.credentialsSecretRef }}/etc/orchestra/nats/creds{{ end -}}
{{- end -}}

{{/* The environment every NATS client container reads.
env: {{- include "mo.natsEnv" $ | nindent 2 }} */}}
{{- define "mo.natsEnv" -}}
- name: NATS_URL
  value: {{ include "mo.natsURL" . | quote }}
- name: NATS_STREAM_REPLICAS
  value: {{ .Values.global.nats.replicas | quote }}
{{- with .Values.global.nats.credentialsSecretRef }}
- name: NATS_CREDENTIALS_DIR
  value: /etc/orchestra/nats
{{- end }}
{{- end -}}

{{/* The credentials volume mount of a NATS client container.
volumeMounts: {{- include "mo.natsVolumeMounts" $ | nindent 2 }} */}}
{{- define "mo.natsVolumeMounts" -}}
{{- with .Values.global.nats.credentialsSecretRef }}
- name: nats-credentials
  mountPath: /etc/orchestra/nats
  readOnly: true
{{- end }}
{{- end -}}

{{/* The credentials volume of a NATS client pod.
volumes: {{- include "mo.natsVolumes" $ | nindent 2 }} */}}
{{- define "mo.natsVolumes" -}}
{{- with .Values.global.nats.credentialsSecretRef }}
- name: nats-credentials
  secret:
    secretName: {{ required "global.nats.credentialsSecretRef.name is required" .name | quote }}
    defaultMode: 0440
{{- end }}
{{- end -}}
